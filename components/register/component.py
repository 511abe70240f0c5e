"""KFP wrapper of the register core."""

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
    registered_model: dsl.Output[dsl.Artifact],
    project: str = "{{$.pipeline_google_cloud_project_id}}",
    location: str = "{{$.pipeline_google_cloud_location}}",
    check_champion: bool = False,
    champion_version: str = "",
):
    """Uploads the merged model to the Vertex Model Registry as a new version.

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
        registered_model: Output: the model version (metadata resourceName, version_id).
        project: Google Cloud project ID. Default: the pipeline job's project.
        location: Vertex region. Default: the pipeline job's region.
        check_champion: Refuse to register when the alias no longer points at
            champion_version (another run promoted a model meanwhile). Default False.
        champion_version: Version ID of the champion evaluate compared with; "" = there
            was none. Default "".
    """
    from components.register.core import RegisterError, build_upload_request, register_model

    try:
        request = build_upload_request(
            merged_model.uri,
            model_id,
            display_name,
            serving_image,
            run_name,
            dict(eval_metrics.metadata),
            alias,
            labels,
            data_lineage={k: str(merged_model.metadata.get(k, "")) for k in ("data_snapshot", "training_key")},
        )
        result = register_model(
            request, project, location, expected_champion=champion_version if check_champion else None
        )
    except RegisterError as exc:
        raise SystemExit(f"register: {exc}") from None
    registered_model.uri = f"https://{location}-aiplatform.googleapis.com/v1/{result.resource_name}@{result.version_id}"
    registered_model.metadata.update(
        {"resourceName": result.resource_name, "version_id": result.version_id, "created_parent": result.created_parent}
    )
