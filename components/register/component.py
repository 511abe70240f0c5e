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
    gate_metric: str = "",
    gate_min_value: float = 0.0,
    gate_min_margin: float = 0.0,
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
        tracking: MLflow settings ({"mlflow_uri", "experiment", "required"}; components.common.tracking):
            the registered version, the data snapshot and the lineage go to the adapter's MLflow run.
            Default None (no MLflow).
        eval_report: evaluate's HTML report; the evaluation links it. Default none.
        gate_reason: evaluate's `reason` output (the gate's decision in words). Default "".
        gate_metric: The gate's metric (`eval.metric`); "" = the rules are not recorded. Default "".
        gate_min_value: The gate's `eval.min_value`. Default 0.0.
        gate_min_margin: The gate's `eval.min_margin`. Default 0.0.

    Output metadata (registered_model): resourceName, version_id, created_parent, aliases,
    evaluation_imported, evaluation (its resource name), evaluation_slices (how many).
    """
    import sys

    from components.register.core import RegisterError, attach_evaluation, build_upload_request, register_model
    from components.register.evaluation import SCHEMA_FILE, build_evaluation

    metrics = dict(eval_metrics.metadata)
    lineage = {
        k: str(merged_model.metadata.get(k, "")) for k in ("data_snapshot", "training_key", "base_model", "adapter")
    }
    rules = {"metric": gate_metric, "min_value": gate_min_value, "min_margin": gate_min_margin} if gate_metric else {}
    folder, folder_uri = registered_model.path, registered_model.uri.rstrip("/")  # before uri names the version
    evaluation = build_evaluation(
        metrics,
        run_name,
        f"{folder_uri}/{SCHEMA_FILE}",
        gate={"reason": gate_reason, **rules},
        lineage={**lineage, "merged_model": merged_model.uri},
        report_uri=eval_report.uri if eval_report is not None else "",
    )
    try:
        request = build_upload_request(
            merged_model.uri,
            model_id,
            display_name,
            serving_image,
            run_name,
            metrics,
            alias,
            labels,
            data_lineage={k: lineage[k] for k in ("data_snapshot", "training_key")},
            container=dict(serving_container),
            promote=promote,
        )
        result = register_model(
            request, project, location, expected_champion=champion_version if check_champion else None, alias=alias
        )
    except RegisterError as exc:
        raise SystemExit(f"register: {exc}") from None
    version = f"{result.resource_name}@{result.version_id}"
    outcome = attach_evaluation(folder, version, evaluation, location)
    kept = "registered and promoted" if promote and alias else "registered"
    for line in outcome.warnings:
        print(f"register: WARNING: {line}; {version} stays {kept}", file=sys.stderr, flush=True)
    registered_model.uri = f"https://{location}-aiplatform.googleapis.com/v1/{version}"
    registered_model.metadata.update(
        {
            "resourceName": result.resource_name,
            "version_id": result.version_id,
            "created_parent": result.created_parent,
            "aliases": [alias, "default"] if promote and alias else [],
            **outcome.metadata(),
        }
    )
    from components.common.tracking import TrackingError, record

    try:
        record(
            tracking,
            "register",
            model_uri=merged_model.uri,
            model_dir=merged_model.path,
            model_meta=dict(merged_model.metadata),
            tags={"version": registered_model.uri, "run_name": run_name},
        )
    except TrackingError as exc:
        raise SystemExit(f"register: {exc}; {result.resource_name}@{result.version_id} is registered") from None


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
    from components.register.core import RegisterError, promote_version

    meta = registered_model.metadata
    try:
        moved = promote_version(
            meta["resourceName"],
            str(meta["version_id"]),
            alias,
            project,
            location,
            expected_champion=champion_version if check_champion else None,
        )
    except RegisterError as exc:
        raise SystemExit(f"promote: {exc}") from None
    print(f"promote: {meta['resourceName']}@{meta['version_id']} is now {alias!r}", flush=True)
    promoted_model.uri = registered_model.uri
    promoted_model.metadata.update(
        {
            "resourceName": meta["resourceName"],
            "version_id": meta["version_id"],
            "aliases": moved,
            "endpoint": deployment.metadata.get("resourceName", ""),
        }
    )
