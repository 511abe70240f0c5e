"""Deploy a registered model version to a Vertex AI endpoint, proved by a smoke test before it takes traffic.

The settings are the config's `deploy` section (`components.deploy.settings.DeploySettings`);
`check_settings` (them, against the job's project and region) and `shifted_split` (the traffic
split after a new model passed) are pure; `deploy_to_vertex` (aiplatform) does the work. The
smoke test itself is `smoke`, a local `swift deploy` is `local_server`.

Order on Vertex (`deploy_to_vertex`): the new version is deployed beside the champion's
deployed models with no traffic, smoke-tested directly (the endpoint's per-deployed-model
`invoke` route), and only then takes its traffic share; the old deployed models are undeployed
only after that and only when the new one takes 100 %. A failed smoke test undeploys the new
deployment: traffic never left the champion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from components.common.tasks import get_task
from components.deploy.errors import DeployError, EndpointLocationError, SmokeTestError
from components.deploy.settings import DeploySettings
from components.deploy.smoke import ANSWER_SHOWN_CHARS, Ask, SmokeResult, run_smoke
from components.deploy.smoke import load_rows as load_rows  # step.py reads its rows through core


@dataclass(frozen=True)
class Deployed:
    """Result of `deploy_to_vertex`.

    Attributes:
        endpoint: Endpoint resource name.
        deployed_model_id: ID of the new DeployedModel.
        created_endpoint: True when this deployment created the endpoint.
        undeployed: IDs of the previous DeployedModels undeployed after the smoke test.
        traffic_split: The endpoint's traffic split at the end.
        smoke: The smoke test's result.
    """

    endpoint: str
    deployed_model_id: str
    created_endpoint: bool
    undeployed: list[str]
    traffic_split: dict[str, int]
    smoke: SmokeResult


def check_settings(settings: DeploySettings, project: str, location: str) -> None:
    """Checks the deploy settings before anything is deployed (the config's checks, again, where the job runs).

    Raises:
        EndpointLocationError: The endpoint resource name is in another project or region.
        DeployError: No endpoint, or a field check of `DeploySettings.checks` fails (the message
            names `deploy.<field>` and what it must be).
    """
    if not settings.endpoint:
        raise DeployError("'deploy.endpoint' is empty: give an endpoint display name or resource name")
    problems = settings.problems()
    if problems:
        raise DeployError(f"{problems[0]}; fix the config's deploy section")
    problem = settings.endpoint_location_problem(project, location)
    if problem:
        raise EndpointLocationError(problem)


def vertex_invoke_ask(
    endpoint: str,
    deployed_model_id: str,
    *,
    location: str,
    credentials: Any = None,
    api_base: str = "",
    model_name: str = "tuned",
    route: str = "/v1/chat/completions",
    timeout_s: float = 300.0,
    max_tokens: int = 512,
) -> Ask:
    """Returns an `ask` that posts an OpenAI chat request to one deployed model of an endpoint.

    It uses the endpoint's `deployedModels/{id}/invoke/{route}` method, which reaches the named
    deployed model whatever the endpoint's traffic split says (so a new model is smoke-tested
    while it still takes no traffic). Vertex forwards the body unchanged to the container's
    route; the model's container spec must allow it (`invokeRoutePrefix`, set by register).

    Args:
        endpoint: Endpoint resource name.
        deployed_model_id: ID of the deployed model that must answer.
        location: Vertex region (the API host).
        credentials: google-auth credentials; default ADC.
        api_base: API root; "" = https://{location}-aiplatform.googleapis.com. Default "".
        model_name: The `model` of each request: the container's served model name (`swift
            deploy` refuses any other). Default "tuned".
        route: The container's chat route. Default "/v1/chat/completions".
        timeout_s: Per-request timeout, s. Default 300.
        max_tokens: Generation limit per answer. Default 512.
    """
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    if credentials is None:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = AuthorizedSession(credentials)
    root = (api_base or f"https://{location}-aiplatform.googleapis.com").rstrip("/")
    url = f"{root}/v1/{endpoint}/deployedModels/{deployed_model_id}/invoke{route}"

    def ask(messages: list[dict]) -> str:
        body = {"model": model_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
        reply = session.post(url, json=body, timeout=timeout_s)
        if reply.status_code != 200:
            raise SmokeTestError(f"{url} answered HTTP {reply.status_code}: {reply.text[:ANSWER_SHOWN_CHARS]}")
        try:
            return reply.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise SmokeTestError(
                f"{url} did not answer a chat completion: {reply.text[:ANSWER_SHOWN_CHARS]!r}"
            ) from None

    return ask


def shifted_split(old_split: dict[str, int], new_id: str, percent: int) -> dict[str, int]:
    """Returns the traffic split that gives `new_id` `percent` and the rest to the old models, in proportion.

    The old models keep their relative shares of the remaining `100 - percent` (rounded down;
    the remainder goes to the largest). Models with no share stay at none; with no old share
    at all the new model takes everything.

    Args:
        old_split: The endpoint's split before (deployed model ID -> percent).
        new_id: The new deployed model's ID.
        percent: The new model's share, 1..100.
    """
    old = {k: int(v) for k, v in old_split.items() if k != new_id and int(v) > 0}
    total = sum(old.values())
    if percent >= 100 or total == 0:
        return {new_id: 100}
    rest = 100 - int(percent)
    split = {k: v * rest // total for k, v in old.items()}
    largest = max(old, key=lambda k: (old[k], k))
    split[largest] += rest - sum(split.values())
    split[new_id] = int(percent)
    return split


def find_or_create_endpoint(endpoint: str, project: str, location: str, credentials: Any = None):
    """Returns (the aiplatform Endpoint, created?) for an endpoint resource name or display name."""
    from google.cloud import aiplatform

    where = {"project": project, "location": location, "credentials": credentials}
    if endpoint.startswith("projects/"):
        return aiplatform.Endpoint(endpoint, **where), False
    found = [e for e in aiplatform.Endpoint.list(**where) if e.display_name == endpoint]
    if len(found) > 1:
        names = ", ".join(e.resource_name for e in found)
        raise DeployError(f"{len(found)} endpoints are named {endpoint!r} ({names}); set deploy.endpoint to one")
    if found:
        return found[0], False
    return aiplatform.Endpoint.create(display_name=endpoint, sync=True, **where), True


def deploy_to_vertex(
    model_name: str,
    settings: DeploySettings,
    project: str,
    location: str,
    rows: Sequence[dict[str, Any]],
    task: str,
    *,
    deployed_name: str = "",
    credentials: Any = None,
    ask_for: Callable[[str, str], Ask] | None = None,
    before_traffic: Callable[[], None] | None = None,
) -> Deployed:
    """Deploys a registered model version, smoke-tests it, then gives it traffic and retires the old models.

    Order: check the settings (nothing touched on error) → find or create the endpoint → deploy
    the version beside the deployed models already there, with no traffic while they serve
    (all traffic on an empty endpoint) → smoke test that deployed model directly (its
    `invoke` route, whatever the split) → only when it passes, the new split (the new model
    takes `traffic_percent`, the old ones keep their proportions of the rest) → at 100 %,
    undeploy the models that were there before. A failed smoke test undeploys the new model;
    the endpoint's traffic never reached it.

    Args:
        model_name: Model version resource name, `projects/P/locations/R/models/ID@VERSION`.
        settings: The config's deploy section: endpoint, machine, GPU, replicas, traffic, timeout,
            served model name (`smoke_rows` is the caller's: it reads `rows`).
        project: Google Cloud project ID.
        location: Vertex region.
        rows: Smoke-test rows (`load_rows`).
        task: Smoke-test task ("detection", "json", "").
        deployed_name: Display name of the deployed model; "" = the model's. Default "".
        credentials: google-auth credentials; default ADC.
        ask_for: (endpoint resource name, deployed model ID) -> `ask` transport; default
            `vertex_invoke_ask`.
        before_traffic: Called after the smoke test passed, before any traffic moves (the
            champion check: another run may have promoted a model meanwhile); when it raises,
            the new model is undeployed like after a failed smoke test. Default none.

    Returns:
        The endpoint, the new deployed model's ID, what was undeployed, the traffic split.

    Raises:
        EndpointLocationError: The endpoint is in another project or region (before deploying).
        DeployError: A setting is invalid (named `deploy.<field>`), or the endpoint name is ambiguous.
        SmokeTestError: The deployed model's answers do not parse (it was undeployed again).
    """
    from google.cloud import aiplatform

    check_settings(settings, project, location)
    get_task(task)
    if not rows:
        raise SmokeTestError("no smoke-test rows")
    model = aiplatform.Model(model_name, project=project, location=location, credentials=credentials)
    endpoint, created = find_or_create_endpoint(settings.endpoint, project, location, credentials)
    new_id, before, old_split = _deploy_without_traffic(endpoint, model, settings, deployed_name)
    transport = ask_for or _invoke_transport(settings.served_model_name, location, credentials)
    ask = transport(endpoint.resource_name, new_id)
    try:
        smoke = run_smoke(ask, rows, task)
        if before_traffic is not None:
            before_traffic()
    except Exception as exc:
        why = "smoke test failed" if isinstance(exc, SmokeTestError) else f"{type(exc).__name__}"
        print(f"deploy: {why}; undeploying {new_id}, traffic stays {old_split or 'none'}", flush=True)
        endpoint.undeploy(new_id)
        raise
    split = shifted_split(old_split, new_id, settings.traffic_percent)
    if split != {k: int(v) for k, v in dict(endpoint.traffic_split).items()}:
        endpoint.update(traffic_split=split)
    undeployed: list[str] = []
    if split == {new_id: 100}:
        for old_id in sorted(before):
            endpoint._sync_gca_resource()  # noqa: SLF001 - the SDK's own refresh
            endpoint.undeploy(old_id)
            undeployed.append(old_id)
    endpoint._sync_gca_resource()  # noqa: SLF001
    final = {k: int(v) for k, v in dict(endpoint.traffic_split).items()}
    return Deployed(endpoint.resource_name, new_id, created, undeployed, final, smoke)


def _invoke_transport(model_name: str, location: str, credentials: Any) -> Callable[[str, str], Ask]:
    def ask_for(endpoint: str, deployed_model_id: str) -> Ask:
        return vertex_invoke_ask(
            endpoint, deployed_model_id, location=location, credentials=credentials, model_name=model_name
        )

    return ask_for


def _deploy_without_traffic(
    endpoint: Any, model: Any, settings: DeploySettings, deployed_name: str
) -> tuple[str, set[str], dict[str, int]]:
    """Deploys `model` to `endpoint` taking no traffic while other models serve; returns (new ID, old IDs, old split)."""
    before = {m.id for m in endpoint.list_models()}
    old_split = {k: int(v) for k, v in dict(endpoint.traffic_split).items()}
    serving = sum(old_split.values()) > 0
    endpoint.deploy(
        model,
        deployed_model_display_name=deployed_name or None,
        traffic_percentage=0 if serving else 100,
        machine_type=settings.machine_type,
        min_replica_count=settings.min_replicas,
        max_replica_count=settings.max_replicas,
        accelerator_type=settings.accelerator_type or None,
        accelerator_count=settings.accelerator_count or None,
        deploy_request_timeout=float(settings.timeout_s),
        sync=True,
    )
    endpoint._sync_gca_resource()  # noqa: SLF001 - the SDK's own refresh after deploy
    new = [m.id for m in endpoint.list_models() if m.id not in before]
    if len(new) != 1:
        raise DeployError(f"expected one new deployed model on {endpoint.resource_name}, found {new}")
    return new[0], before, old_split
