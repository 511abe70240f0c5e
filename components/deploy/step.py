"""The deploy step as its KFP wrapper runs it (pure: no kfp): settings rebuilt, rows read, deployed, recorded.

`run_step` rebuilds the config's deploy section (`DeploySettings.from_dict`), reads the first
`smoke_rows` rows of the eval dataset, deploys the registered version with the champion check
before traffic moves (`components.common.registry`), and returns the `StepOutputs`
(`components.common.kfp_outputs`) the wrapper writes onto its `deployment` artifact. A refused
setting, a failed deployment or smoke test, or a champion promoted meanwhile ends it with
SystemExit("deploy: <error type>: ...").
"""

from __future__ import annotations

from typing import Any

from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.common.registry import ChampionChanged, alias_version
from components.common.registry import check_champion as champion_check
from components.deploy.core import Deployed, DeployError, deploy_to_vertex, load_rows
from components.deploy.settings import DeploySettings

SMOKE_ANSWER_CHARS = 500  # of each smoke-test answer kept in the deployment's metadata


def run_step(
    registered_model: ArtifactLike,
    eval_dataset: ArtifactLike,
    *,
    settings: dict[str, Any],
    task: str,
    project: str,
    location: str,
    alias: str = "",
    check_champion: bool = False,
    champion_version: str = "",
) -> StepOutputs:
    """Runs the deploy step; the arguments are the component's (see `components.deploy.component`).

    Returns:
        uris and metadata of the `deployment` output: the endpoint, the deployed model's ID, the
        traffic split, what was undeployed, the smoke-test answers and seconds.

    Raises:
        SystemExit: "deploy: <DeployError or a subclass, or ChampionChanged>: <what and the fix>".
    """
    meta = registered_model.metadata
    parent = meta["resourceName"]

    def before_traffic() -> None:
        if check_champion and alias:
            now = alias_version(parent, alias, project, location)
            champion_check(parent, alias, champion_version, now, action="given traffic")

    try:
        deploy = DeploySettings.from_dict(settings)
        rows = load_rows(eval_dataset.path, deploy.smoke_rows)
        result = deploy_to_vertex(
            f"{parent}@{meta['version_id']}", deploy, project, location, rows, task, before_traffic=before_traffic
        )
    except (DeployError, ChampionChanged) as exc:
        raise SystemExit(f"deploy: {type(exc).__name__}: {exc}") from None
    return _outputs(result, location)


def _outputs(result: Deployed, location: str) -> StepOutputs:
    return StepOutputs(
        uris={"deployment": f"https://{location}-aiplatform.googleapis.com/v1/{result.endpoint}"},
        metadata={
            "deployment": {
                "resourceName": result.endpoint,
                "deployed_model_id": result.deployed_model_id,
                "traffic_split": result.traffic_split,
                "undeployed": result.undeployed,
                "created_endpoint": result.created_endpoint,
                "smoke_answers": [a["answer"][:SMOKE_ANSWER_CHARS] for a in result.smoke.answers],
                "smoke_seconds": result.smoke.seconds,
            }
        },
    )
