"""KFP wrapper of the deploy core: deploy the registered version, smoke-test it, retire the old champion."""

from google_cloud_pipeline_components.types.artifact_types import VertexEndpoint, VertexModel
from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def deploy(
    registered_model: dsl.Input[VertexModel],
    eval_dataset: dsl.Input[dsl.Dataset],
    endpoint: str,
    machine_type: str,
    task: str,
    deployment: dsl.Output[VertexEndpoint],
    accelerator_type: str = "",
    accelerator_count: int = 0,
    min_replicas: int = 1,
    max_replicas: int = 1,
    traffic_percent: int = 100,
    smoke_rows: int = 3,
    served_model_name: str = "tuned",
    deploy_timeout_s: int = 3600,
    alias: str = "",
    check_champion: bool = False,
    champion_version: str = "",
    project: str = "{{$.pipeline_google_cloud_project_id}}",
    location: str = "{{$.pipeline_google_cloud_location}}",
):
    """Deploys the registered model version to an endpoint and smoke-tests it there.

    Args:
        registered_model: register's output (metadata resourceName, version_id).
        eval_dataset: Validated eval dataset (data.jsonl + images/); its first rows are the smoke test.
        endpoint: Endpoint display name (created when missing) or resource name in this project and region.
        machine_type: Serving machine type, e.g. g2-standard-12.
        task: Smoke-test task: "detection", "json" or "" (non-empty text).
        deployment: Output: metadata endpoint, deployed_model_id, traffic_split, undeployed, smoke answers.
        accelerator_type: e.g. NVIDIA_L4; "" = none. Default "".
        accelerator_count: GPUs per replica. Default 0.
        min_replicas: Default 1.
        max_replicas: Default 1.
        traffic_percent: Traffic share of the new version, 1..100; 100 undeploys the previous
            models after the smoke test. Default 100.
        smoke_rows: Rows sent in the smoke test. Default 3.
        served_model_name: The serving container's model name (the `model` of each smoke-test
            request). Default "tuned" (the default container's).
        deploy_timeout_s: Longest wait for the deployment, s. Default 3600.
        alias: The champion alias checked before traffic moves. Default "".
        check_champion: Before the new model gets traffic, refuse (and undeploy it) when the
            alias no longer points at champion_version. Default False.
        champion_version: Version ID of the champion evaluate compared with; "" = none. Default "".
        project: Google Cloud project ID. Default: the pipeline job's project.
        location: Vertex region. Default: the pipeline job's region.
    """
    from components.common.registry import ChampionChanged, alias_version
    from components.common.registry import check_champion as champion_check
    from components.deploy.core import DeployError, DeployPlan, deploy_to_vertex, load_rows

    meta = registered_model.metadata
    plan = DeployPlan(
        endpoint=endpoint,
        machine_type=machine_type,
        accelerator_type=accelerator_type,
        accelerator_count=accelerator_count,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        traffic_percent=traffic_percent,
        deploy_timeout_s=float(deploy_timeout_s),
        served_model_name=served_model_name,
    )
    try:
        rows = load_rows(eval_dataset.path, smoke_rows)
        parent = meta["resourceName"]

        def before_traffic() -> None:
            if check_champion and alias:
                now = alias_version(parent, alias, project, location)
                champion_check(parent, alias, champion_version, now, action="given traffic")

        result = deploy_to_vertex(
            f"{parent}@{meta['version_id']}", plan, project, location, rows, task, before_traffic=before_traffic
        )
    except (DeployError, ChampionChanged) as exc:
        raise SystemExit(f"deploy: {type(exc).__name__}: {exc}") from None
    deployment.uri = f"https://{location}-aiplatform.googleapis.com/v1/{result.endpoint}"
    deployment.metadata.update(
        {
            "resourceName": result.endpoint,
            "deployed_model_id": result.deployed_model_id,
            "traffic_split": result.traffic_split,
            "undeployed": result.undeployed,
            "created_endpoint": result.created_endpoint,
            "smoke_answers": [a["answer"][:500] for a in result.smoke.answers],
            "smoke_seconds": result.smoke.seconds,
        }
    )
