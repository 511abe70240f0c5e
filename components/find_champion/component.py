"""KFP wrapper of the find-champion core."""

from typing import NamedTuple

from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def find_champion(
    model_id: str,
    alias: str,
    project: str = "{{$.pipeline_google_cloud_project_id}}",
    location: str = "{{$.pipeline_google_cloud_location}}",
) -> NamedTuple("Outputs", [("uri", str), ("version_id", str), ("resource_name", str)]):
    """Looks up the current champion (MODEL_ID@ALIAS) in the Vertex AI Model Registry.

    Args:
        model_id: Parent model ID (the config's register.model_id).
        alias: Version alias of the champion (register.alias), e.g. champion.
        project: Google Cloud project ID. Default: the pipeline job's project.
        location: Vertex region. Default: the pipeline job's region.

    Returns:
        uri: gs:// folder of the champion's merged model; "" = no champion yet (use the base).
        version_id: The champion's version ID; "" = no champion.
        resource_name: projects/P/locations/R/models/ID@VERSION; "" = no champion.
    """
    from collections import namedtuple

    from components.find_champion.core import ChampionLookupError, vertex_fetch
    from components.find_champion.core import find_champion as lookup

    try:
        champion = lookup(project, location, model_id, alias, vertex_fetch(project, location))
    except ChampionLookupError as exc:
        raise SystemExit(f"find-champion: {exc}") from None
    print(f"find-champion: {champion.message}", flush=True)
    return namedtuple("Outputs", ["uri", "version_id", "resource_name"])(
        champion.uri, champion.version_id, champion.resource_name
    )
