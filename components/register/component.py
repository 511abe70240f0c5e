"""KFP wrapper of the register core."""

from google_cloud_pipeline_components.types.artifact_types import VertexEndpoint, VertexModel
from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def register(
    merged_model: dsl.Input[dsl.Model],
    eval_metrics: dsl.Input[dsl.Metrics],
    model_id: str,
    display_name: str,
    serving_image: str,
    alias: str,
    labels: dict,
    run_name: str,
    serving_container: dict,
    registered_model: dsl.Output[VertexModel],
    project: str = "{{$.pipeline_google_cloud_project_id}}",
    location: str = "{{$.pipeline_google_cloud_location}}",
    check_champion: bool = False,
    champion_version: str = "",
    promote: bool = True,
    tracking: dict = None,
    eval_report: dsl.Input[dsl.HTML] = None,
    gate_reason: str = "",
    gate_rules: dict = None,
):
    """Uploads the merged model to the Vertex Model Registry as a new version, with its evaluation.

    The version gets a ModelEvaluation (the console's Evaluate tab; `components.register.evaluation`
    says what it holds) and a slice per label and per regression kind. A failed import is one
    WARNING line naming the version and the permission; the version stays registered (and
    promoted) and the output records `evaluation_imported: false`.

    Args:
        merged_model: Merged model from merge-export (a gs:// folder).
        eval_metrics: Metrics from evaluate (copied into labels and the description; the
            reference evaluate compared with becomes the `reference` label).
        model_id: Parent model ID (created by the first registration).
        display_name: Model display name.
        serving_image: Serving container image.
        alias: Alias moved to the new version (e.g. champion).
        labels: Extra labels.
        run_name: Pipeline job name (the run_id label).
        serving_container: Serving container spec (command, args, port, predict_route,
            health_route, env); empty values = the project's `swift deploy` entry point.
        registered_model: Output: the model version (metadata resourceName, version_id).
        project: Google Cloud project ID. Default: the pipeline job's project.
        location: Vertex region. Default: the pipeline job's region.
        check_champion: Refuse to register when the alias no longer points at
            champion_version (another run promoted a model meanwhile). Default False.
        champion_version: Version ID of the champion evaluate compared with; "" = there
            was none. Default "".
        promote: Move the alias to the new version now; False when a deploy step promotes it
            after its smoke test. Default True.
        tracking: MLflow settings ({"mlflow_uri", "experiment", "required", "register_model"};
            components.common.tracking): the registered version, the data snapshot and the lineage go to the
            adapter's MLflow run; with register_model, its MLflow model version gets the Vertex version as a
            tag. Default None (no MLflow).
        eval_report: evaluate's HTML report; the evaluation links it. Default none.
        gate_reason: evaluate's `reason` output (the gate's decision in words). Default "".
        gate_rules: The run's eval settings (the pipeline's `eval_settings`); its `metric`,
            `min_value` and `min_margin` are recorded as the gate's rules, other keys are not read.
            Default None (the rules are not recorded).

    Output metadata (registered_model): resourceName, version_id, created_parent, aliases,
    evaluation_imported, evaluation (its resource name), evaluation_slices (how many).
    """
    from components.common.kfp_outputs import write_outputs
    from components.register.step import register_step

    write_outputs(
        register_step(
            merged_model, eval_metrics, registered_model, model_id=model_id, display_name=display_name,
            serving_image=serving_image, alias=alias, labels=labels, run_name=run_name,
            serving_container=serving_container, project=project, location=location, check_champion=check_champion,
            champion_version=champion_version, promote=promote, tracking=tracking, eval_report=eval_report,
            gate_reason=gate_reason, gate_rules=gate_rules,
        ),
        registered_model=registered_model,
    )  # fmt: skip


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def promote(
    registered_model: dsl.Input[VertexModel],
    deployment: dsl.Input[VertexEndpoint],
    alias: str,
    promoted_model: dsl.Output[VertexModel],
    project: str = "{{$.pipeline_google_cloud_project_id}}",
    location: str = "{{$.pipeline_google_cloud_location}}",
    check_champion: bool = False,
    champion_version: str = "",
):
    """Moves the champion alias to a registered version whose deployment passed its smoke test.

    Args:
        registered_model: register's output (metadata resourceName, version_id).
        deployment: deploy's output; its presence is the proof the smoke test passed (this
            task runs only after deploy succeeded).
        alias: The champion alias.
        promoted_model: Output: the promoted version (metadata resourceName, version_id,
            aliases, endpoint).
        project: Google Cloud project ID. Default: the pipeline job's project.
        location: Vertex region. Default: the pipeline job's region.
        check_champion: Refuse when the alias no longer points at champion_version. Default False.
        champion_version: Version ID of the champion evaluate compared with; "" = none. Default "".
    """
    from components.common.kfp_outputs import write_outputs
    from components.register.step import promote_step

    write_outputs(
        promote_step(
            registered_model, deployment, alias=alias, project=project, location=location,
            check_champion=check_champion, champion_version=champion_version,
        ),
        promoted_model=promoted_model,
    )  # fmt: skip
