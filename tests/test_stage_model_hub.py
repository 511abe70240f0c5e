"""stage-model from hf:// (a fake hub speaking the Hugging Face protocol) and ms:// (a fake client)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from components.common import model_sources as _sources
from components.common.model_sources import parse_source, read_token
from components.stage_model import sources
from components.stage_model.core import result_summary, stage_model
from components.stage_model.entry import MANIFEST, verify_entry
from components.stage_model.errors import StageError
from tests.conftest import HubRepo
from tests.test_stage_model import make_model

TOKEN = "hf_SECRET_do_not_leak_123"


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def repo_files(tmp_path) -> dict[str, bytes]:
    files = folder_bytes(make_model(tmp_path / "hubsrc"))
    files["pytorch_model.bin"] = b"\0" * 64
    files["original/consolidated.pth"] = b"\1" * 32
    return files


@pytest.fixture
def hub(hub_server, repo_files):
    hub_server.repos["org/tiny"] = HubRepo(repo_files)
    hub_server.repos["org/gated"] = HubRepo(repo_files, gated=True, token=TOKEN)
    return hub_server


# --- parsing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, revision, expected",
    [
        ("hf://Qwen/Qwen3-VL-4B-Instruct", None, ("hf", ["Qwen", "Qwen3-VL-4B-Instruct"], None)),
        ("hf://Qwen/Qwen3-VL-4B-Instruct@v1.0", None, ("hf", ["Qwen", "Qwen3-VL-4B-Instruct"], "v1.0")),
        ("hf://Qwen/Qwen3-VL-4B-Instruct", "abc123", ("hf", ["Qwen", "Qwen3-VL-4B-Instruct"], "abc123")),
        ("ms://Qwen/Qwen3-VL-4B-Instruct@master", "master", ("ms", ["Qwen", "Qwen3-VL-4B-Instruct"], "master")),
        ("gs://bucket/models/qwen", None, ("gs", ["bucket", "models", "qwen"], None)),
    ],
)
def test_parse_source(source, revision, expected):
    spec = parse_source(source, revision)
    assert (spec.scheme, spec.parts, spec.revision) == expected


@pytest.mark.parametrize(
    "source, revision, fragment",
    [
        ("s3://bucket/model", None, "unknown scheme 's3://'"),
        ("hf://just-a-name", None, "expected hf://org/name"),
        ("ms://a/b/c", None, "expected ms://org/name"),
        ("hf://org/name@v1", "v2", "differs from --revision"),
        ("gs://bucket/m@v1", None, "no revision"),
        ("gs://bucket", None, "gs://bucket/prefix"),
    ],
)
def test_bad_sources_are_one_line_errors(source, revision, fragment, tmp_path):
    with pytest.raises(StageError) as info:
        stage_model(source, str(tmp_path / "cache"), revision=revision)
    msg = str(info.value)
    assert fragment in msg and source in msg and "\n" not in msg
    assert not (tmp_path / "cache").exists()


def test_token_sources(monkeypatch):
    monkeypatch.setenv("MY_TOKEN", "abc")
    assert read_token("env:MY_TOKEN", "HF_TOKEN") == "abc"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert read_token(None, "HF_TOKEN") is None
    monkeypatch.setenv("HF_TOKEN", "def")
    assert read_token(None, "HF_TOKEN") == "def"
    with pytest.raises(_sources.SourceError, match="MISSING_VAR is not set"):
        read_token("env:MISSING_VAR", "HF_TOKEN")
    with pytest.raises(_sources.SourceError, match="never the token itself"):
        read_token("hf_abcdef", "HF_TOKEN")  # a clear-text token is refused, and not echoed
    calls = []
    monkeypatch.setattr(_sources, "_access_secret", lambda name: calls.append(name) or "from-sm")
    assert read_token("projects/p/secrets/hf-token", "HF_TOKEN") == "from-sm"
    assert read_token("projects/p/secrets/hf-token/versions/3", "HF_TOKEN") == "from-sm"
    assert calls == ["projects/p/secrets/hf-token/versions/latest", "projects/p/secrets/hf-token/versions/3"]


def test_clear_text_token_is_not_echoed():
    with pytest.raises(_sources.SourceError) as info:
        read_token("hf_abcdef", "HF_TOKEN")
    assert "hf_abcdef" not in str(info.value)


# --- hf:// against the fake hub -------------------------------------------------


def test_hf_stage_resolves_revision_and_hits(hub, tmp_path, repo_files):
    cache = tmp_path / "cache"
    result = stage_model("hf://org/tiny", str(cache))
    commit = hub.repos["org/tiny"].refs["main"]
    assert result.cache_hit is False
    assert Path(result.entry) == (cache / "hf" / "org" / "tiny" / commit).resolve()
    assert result.manifest["revision"] == commit and result.manifest["requested_revision"] == ""
    assert result.manifest["source"] == "hf://org/tiny"
    assert folder_bytes(Path(result.entry)) == {**repo_files, MANIFEST: (Path(result.entry) / MANIFEST).read_bytes()}
    assert verify_entry(result.entry) == (True, "ok")
    n_requests = len(hub.requests)
    again = stage_model("hf://org/tiny@main", str(cache))
    assert again.cache_hit is True and again.bytes_copied == 0 and again.entry == result.entry
    # a hit costs one metadata call and no file download
    assert [r[1] for r in hub.requests[n_requests:]] == ["/api/models/org/tiny/revision/main?blobs=true"]


def test_hf_revision_by_branch_and_commit(hub, tmp_path, repo_files):
    repo = hub.repos["org/tiny"]
    old = repo.refs["main"]
    new = repo.add_commit("main", {**repo_files, "README.md": b"v2\n"})
    repo.refs["v1"] = old
    by_tag = stage_model("hf://org/tiny", str(tmp_path / "c"), revision="v1")
    assert by_tag.manifest["revision"] == old and by_tag.manifest["requested_revision"] == "v1"
    assert (Path(by_tag.entry) / "README.md").read_bytes() == repo_files["README.md"]
    by_commit = stage_model(f"hf://org/tiny@{old}", str(tmp_path / "c"))
    assert by_commit.cache_hit is True and by_commit.entry == by_tag.entry
    latest = stage_model("hf://org/tiny", str(tmp_path / "c"))
    assert latest.manifest["revision"] == new and Path(latest.entry).name == new
    assert (Path(latest.entry) / "README.md").read_bytes() == b"v2\n"


def test_hf_allow_and_ignore_patterns(hub, tmp_path):
    result = stage_model("hf://org/tiny", str(tmp_path / "c"), ignore=["*.bin", "original/*"])
    assert sorted(result.manifest["files"]) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    downloads = [r[1] for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert not [d for d in downloads if d.endswith(".bin") or "/original/" in d]
    commit = hub.repos["org/tiny"].refs["main"]
    assert Path(result.entry).name.startswith(commit + "-")  # a selection is its own entry
    allowed = stage_model("hf://org/tiny", str(tmp_path / "c"), allow=["*.json", "*.safetensors"])
    assert "README.md" not in allowed.manifest["files"] and allowed.entry != result.entry
    assert verify_entry(allowed.entry) == (True, "ok")


def test_hf_gcs_cache(hub, gcs_bucket):
    result = stage_model("hf://org/tiny", f"gs://{gcs_bucket}/models", ignore=["*.bin", "original/*"])
    commit = hub.repos["org/tiny"].refs["main"]
    assert result.entry.startswith(f"gs://{gcs_bucket}/models/hf/org/tiny/{commit}-")
    assert verify_entry(result.entry) == (True, "ok")
    assert stage_model("hf://org/tiny", f"gs://{gcs_bucket}/models", ignore=["*.bin", "original/*"]).cache_hit


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("hf://org/missing", "repo not found"),
        ("hf://org/tiny@no-such-branch", "revision 'no-such-branch' not found"),
    ],
)
def test_hf_not_found_errors(hub, tmp_path, source, fragment):
    with pytest.raises(StageError) as info:
        stage_model(source, str(tmp_path / "cache"))
    msg = str(info.value)
    assert fragment in msg and source.split("@")[0] in msg and "\n" not in msg
    assert not (tmp_path / "cache").exists()


def test_hf_repo_without_safetensors(hub, tmp_path, repo_files):
    hub.repos["org/bin-only"] = HubRepo({k: v for k, v in repo_files.items() if not k.endswith(".safetensors")})
    with pytest.raises(StageError, match="hf://org/bin-only: no \\*.safetensors"):
        stage_model("hf://org/bin-only", str(tmp_path / "cache"))
    assert not [r for r in hub.requests if "/resolve/" in r[1]]  # failed before downloading
    assert not (tmp_path / "cache").exists()


def test_hf_unsupported_architecture(hub, tmp_path):
    hub.repos["org/llama"] = HubRepo(folder_bytes(make_model(tmp_path / "llama", arch="LlamaForCausalLM")))
    with pytest.raises(StageError, match="'LlamaForCausalLM'.*not supported"):
        stage_model("hf://org/llama", str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").rglob(MANIFEST)) if (tmp_path / "cache").exists() else True


def test_gated_repo_without_token_is_a_named_error(hub, tmp_path):
    with pytest.raises(StageError) as info:
        stage_model("hf://org/gated", str(tmp_path / "cache"))
    msg = str(info.value)
    assert "hf://org/gated" in msg and "gated repo needs a token" in msg and "HF_TOKEN" in msg
    assert not list((tmp_path / "cache").rglob(MANIFEST)) if (tmp_path / "cache").exists() else True


def test_gated_repo_with_a_wrong_token(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(StageError, match="hf://org/gated.*token has no access"):
        stage_model("hf://org/gated", str(tmp_path / "cache"))


def test_gated_repo_with_token_succeeds_and_token_never_leaks(hub, tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.setenv("SECRET_HF", TOKEN)
    caplog.set_level(logging.DEBUG)
    result = stage_model("hf://org/gated", str(tmp_path / "cache"), token_from="env:SECRET_HF", progress=True)
    assert result.cache_hit is False and verify_entry(result.entry) == (True, "ok")
    auths = {r[2].get("authorization") for r in hub.requests if "/resolve/" in r[1]}
    assert auths == {f"Bearer {TOKEN}"}  # the token was used...
    out = capsys.readouterr()
    # ...and appears nowhere: logs, stdout/stderr, manifest, metadata, files of the entry
    assert TOKEN not in out.out + out.err + caplog.text
    assert TOKEN not in json.dumps(result_summary(result)) + json.dumps(result.manifest)
    for path in Path(result.entry).rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes()
    for path in (tmp_path / "cache").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes()


def test_download_size_mismatch_is_detected(hub, tmp_path, monkeypatch):
    real = sources.resolve_hf

    def lying(spec, token):
        listing = real(spec, token)
        listing.files["config.json"] += 1
        return listing

    monkeypatch.setattr(sources, "resolve_hf", lying)
    with pytest.raises(StageError, match="config.json downloaded .* expected"):
        stage_model("hf://org/tiny", str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").rglob(MANIFEST)) if (tmp_path / "cache").exists() else True


# --- ms:// with a fake ModelScope client --------------------------------------------


class FakeMsApi:
    def __init__(self, files: dict[str, bytes], commit: str = "c0ffee", fail: Exception | None = None):
        self.files, self.commit, self.fail = files, commit, fail
        self.calls = []

    def get_valid_revision_detail(self, model_id, revision=None):
        self.calls.append(("revision", model_id, revision))
        if self.fail:
            raise self.fail
        return {"Revision": revision, "CommitId": self.commit}

    def get_model_files(self, model_id, revision=None, recursive=True):
        self.calls.append(("files", model_id, revision))
        return [{"Path": k, "Size": len(v), "Type": "blob"} for k, v in self.files.items()]

    def model_file_download(self, model_id, rel, revision=None, local_dir=None):
        self.calls.append(("download", rel, revision))
        path = Path(local_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.files[rel])
        return str(path)


def test_ms_stage_with_fake_client(tmp_path, repo_files, monkeypatch):
    api = FakeMsApi(repo_files)
    monkeypatch.setattr(_sources, "_ms_api", lambda token: api)
    result = stage_model("ms://Qwen/Tiny@v1.0", str(tmp_path / "cache"), ignore=["*.bin", "original/*"])
    assert result.manifest["revision"] == "c0ffee" and result.manifest["requested_revision"] == "v1.0"
    assert Path(result.entry).parent == (tmp_path / "cache" / "ms" / "Qwen" / "Tiny").resolve()
    assert ("files", "Qwen/Tiny", "c0ffee") in api.calls
    assert verify_entry(result.entry) == (True, "ok")


@pytest.mark.parametrize(
    "error, fragment",
    [
        (RuntimeError("404 model not found"), "repo not found"),
        (RuntimeError("Invalid revision 'vX'"), "revision 'vX' not found"),
        (RuntimeError("HTTP 403"), "no permission"),
        (ConnectionError("boom"), "ModelScope error"),
    ],
)
def test_ms_errors_are_named(tmp_path, monkeypatch, error, fragment):
    monkeypatch.setattr(_sources, "_ms_api", lambda token: FakeMsApi({}, fail=error))
    with pytest.raises(StageError) as info:
        stage_model("ms://Qwen/Tiny@vX", str(tmp_path / "cache"))
    assert fragment in str(info.value) and "ms://Qwen/Tiny" in str(info.value)
    assert not (tmp_path / "cache").exists()
