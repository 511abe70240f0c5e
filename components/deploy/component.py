"""KFP wrapper of the deploy step: deploy the registered version, smoke-test it, retire the old champion."""

from google_cloud_pipeline_components.types.artifact_types import VertexEndpoint, VertexModel
from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def deploy(
    registered_model: dsl.Input[VertexModel],
    eval_dataset: dsl.Input[dsl.Dataset],
    settings: dict,
    task: str,
    deployment: dsl.Output[VertexEndpoint],
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
        settings: The config's deploy section as a mapping (`components.deploy.settings.DeploySettings`:
            endpoint, machine, GPU, replicas, traffic_percent, smoke_rows, served_model_name, timeout_s).
        task: Smoke-test task: "detection", "json" or "" (non-empty text).
        deployment: Output: metadata endpoint, deployed_model_id, traffic_split, undeployed, smoke answers.
        alias: The champion alias checked before traffic moves. Default "".
        check_champion: Before the new model gets traffic, refuse (and undeploy it) when the
            alias no longer points at champion_version. Default False.
        champion_version: Version ID of the champion evaluate compared with; "" = none. Default "".
        project: Google Cloud project ID. Default: the pipeline job's project.
        location: Vertex region. Default: the pipeline job's region.
    """
    from components.common.kfp_outputs import write_outputs
    from components.deploy.step import run_step

    write_outputs(
        run_step(
            registered_model,
            eval_dataset,
            settings=settings,
            task=task,
            project=project,
            location=location,
            alias=alias,
            check_champion=check_champion,
            champion_version=champion_version,
        ),
        deployment=deployment,
    )
