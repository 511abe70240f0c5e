"""find-champion: the core with a fake fetch, then the real aiplatform client against the local recording server."""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials

from components.find_champion.core import ChampionLookupError, find_champion, model_name, vertex_fetch
from components.register.core import RegisterError, build_upload_request, register_model
from pipelines.vertex import init_vertex
from tests.test_vertex_submit import PARENT, api  # noqa: F401 (fixture)

CRED = AnonymousCredentials()
MODEL = f"{PARENT}/models/qwen-drawings"


def _fetch(answers: dict):
    """A fetch that answers from a dict (missing name = NOT_FOUND) and records the names asked."""
    calls: list[str] = []

    def fetch(name):
        calls.append(name)
        answer = answers.get(name)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return fetch, calls


def _find(fetch, model_id="qwen-drawings", alias="champion"):
    return find_champion("test-project", "us-central1", model_id, alias, fetch)


# --- core ------------------------------------------------------------------------------


def test_model_name():
    assert model_name("p", "europe-west4", "m", "champion") == "projects/p/locations/europe-west4/models/m@champion"
    assert model_name("p", "europe-west4", "m") == "projects/p/locations/europe-west4/models/m"


def test_champion_present_gives_its_uri_and_version():
    fetch, calls = _fetch(
        {
            f"{MODEL}@champion": {
                "version_id": "3",
                "artifact_uri": "gs://b/root/run-7/merged/",
                "version_aliases": ["champion"],
            }
        }
    )
    champion = _find(fetch)
    assert champion.uri == "gs://b/root/run-7/merged"
    assert champion.version_id == "3"
    assert champion.resource_name == f"{MODEL}@3"
    assert "champion is" in champion.message and "@3" in champion.message
    assert calls == [f"{MODEL}@champion"]  # one look-up; the parent is asked only when the alias is missing


def test_no_parent_model_yet_falls_back_to_the_base():
    fetch, calls = _fetch({})
    champion = _find(fetch)
    assert (champion.uri, champion.version_id, champion.resource_name) == ("", "", "")
    assert "no model" in champion.message and "first registration" in champion.message
    assert "comparing with the base model" in champion.message
    assert calls == [f"{MODEL}@champion", MODEL]


def test_parent_without_the_alias_falls_back_to_the_base():
    fetch, calls = _fetch({MODEL: {"version_id": "1", "artifact_uri": "gs://b/m1", "version_aliases": ["default"]}})
    champion = _find(fetch, alias="best")
    assert champion.uri == "" and champion.version_id == ""
    assert "has no version with alias 'best'" in champion.message
    assert calls == [f"{MODEL}@best", MODEL]


@pytest.mark.parametrize(
    "error, hint",
    [
        (exceptions.PermissionDenied("caller lacks aiplatform.models.get"), "roles/aiplatform.user"),
        (exceptions.ServiceUnavailable("backend down"), "retry the run"),
        (exceptions.InternalServerError("boom"), "check the project, region"),
    ],
)
def test_api_error_is_a_named_error_with_a_hint(error, hint):
    fetch, _ = _fetch({f"{MODEL}@champion": error})
    with pytest.raises(ChampionLookupError) as info:
        _find(fetch)
    msg = str(info.value)
    assert f"cannot look up {MODEL}@champion" in msg and type(error).__name__ in msg and hint in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained stack trace


def test_api_error_on_the_parent_look_up_is_named_too():
    fetch, _ = _fetch({MODEL: exceptions.Forbidden("no access")})
    with pytest.raises(ChampionLookupError, match=f"cannot look up {MODEL} in the Model Registry: Forbidden"):
        _find(fetch)


def test_champion_without_a_gs_artifact_is_refused():
    fetch, _ = _fetch({f"{MODEL}@champion": {"version_id": "2", "artifact_uri": ""}})
    with pytest.raises(ChampionLookupError, match="not a gs:// folder.*eval.reference: base"):
        _find(fetch)


@pytest.mark.parametrize("field", ["model_id", "alias"])
def test_empty_model_id_or_alias_is_named(field):
    fetch, calls = _fetch({})
    with pytest.raises(ChampionLookupError, match=f"register.{field} is empty"):
        _find(fetch, **{field: ""})
    assert calls == []


# --- the real aiplatform client against the local recording server ---------------------


def _register(merged: str, run: str, expected_champion: str | None = None):
    req = build_upload_request(
        merged, "qwen-drawings", "Qwen drawings", "img:1", run, {"tuned_f1": 0.8, "reference": "base"}
    )
    return register_model(req, "test-project", "us-central1", CRED, expected_champion=expected_champion)


def test_real_client_finds_the_champion_by_alias(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    fetch = vertex_fetch("test-project", "us-central1", CRED)

    first = find_champion("test-project", "us-central1", "qwen-drawings", "champion", fetch)  # empty registry
    assert first.uri == "" and "first registration" in first.message
    asked = [r.path for r in api.requests if r.method == "GET"]
    assert asked[0].replace("%40", "@").endswith("/models/qwen-drawings@champion")
    assert asked[1].endswith("/models/qwen-drawings")

    _register("gs://test-bucket/root/run-1/merged", "run-1")
    _register("gs://test-bucket/root/run-2/merged", "run-2")
    api.requests.clear()
    champion = find_champion("test-project", "us-central1", "qwen-drawings", "champion", fetch)
    [get] = [r for r in api.requests if r.method == "GET"]
    assert get.path.replace("%40", "@") == f"/v1/{MODEL}@champion"
    assert champion.uri == "gs://test-bucket/root/run-2/merged"  # the alias moved to the newest version
    assert champion.version_id == "2" and champion.resource_name == f"{MODEL}@2"


def test_real_client_api_error_becomes_a_named_error(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    api.errors[f"{MODEL}@champion"] = (403, "PERMISSION_DENIED")
    with pytest.raises(
        ChampionLookupError,
        match="@champion in the Model Registry: (Forbidden|PermissionDenied): 403.*roles/aiplatform.user",
    ):
        find_champion(
            "test-project",
            "us-central1",
            "qwen-drawings",
            "champion",
            vertex_fetch("test-project", "us-central1", CRED),
        )


def test_register_refuses_when_the_champion_moved_during_the_run(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    first = _register("gs://test-bucket/root/run-1/merged", "run-1", expected_champion="")  # none before, none now
    assert first.version_id == "1"
    # this run looked up "no champion", but run-1 was promoted meanwhile: not compared with it, refused
    with pytest.raises(RegisterError, match="champion changed during this run.*no champion.*now points at version 1"):
        _register("gs://test-bucket/root/run-2/merged", "run-2", expected_champion="")
    assert len(api.calls("POST", "models:upload")) == 1
    second = _register("gs://test-bucket/root/run-3/merged", "run-3", expected_champion="1")
    assert second.version_id == "2"
    [_, upload] = api.calls("POST", "models:upload")
    assert upload.body["model"]["labels"]["reference"] == "base"


def test_register_labels_name_the_reference():
    champion = build_upload_request("gs://b/m", "m", "", "img:1", "run-9", {"reference": "champion@3", "tuned_f1": 0.9})
    assert champion["labels"]["reference"] == "champion-3"
    assert '"reference": "champion@3"' in champion["version_description"]
    assert "reference" not in build_upload_request("gs://b/m", "m", "", "img:1", "run-9", {"tuned_f1": 0.9})["labels"]


def test_component_function_against_the_fake(api, capsys):
    """The KFP wrapper's body: one call into the core, outputs as a NamedTuple, errors as a clean exit."""
    from components.find_champion import find_champion as component

    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    run = component.python_func
    out = run(model_id="qwen-drawings", alias="champion", project="test-project", location="us-central1")
    assert (out.uri, out.version_id, out.resource_name) == ("", "", "")
    assert "no champion, comparing with the base model" in capsys.readouterr().out
    _register("gs://test-bucket/root/run-1/merged", "run-1")
    out = run(model_id="qwen-drawings", alias="champion", project="test-project", location="us-central1")
    assert (out.uri, out.version_id) == ("gs://test-bucket/root/run-1/merged", "1")
    api.errors[f"{MODEL}@champion"] = (403, "PERMISSION_DENIED")
    with pytest.raises(SystemExit, match="^find-champion: cannot look up .*roles/aiplatform.user"):
        run(model_id="qwen-drawings", alias="champion", project="test-project", location="us-central1")
