"""KFP wrapper of the stage-model core."""

from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def stage_model(
    source: str,
    cache: str,
    revision: str,
    token_from: str,
    allow: list,
    ignore: list,
    model: dsl.Output[dsl.Model],
):
    """Stages the base model into the model cache and points the Model artifact at it.

    Args:
        source: hf://org/name[@rev], ms://org/name[@rev], gs://bucket/prefix or a folder.
        cache: Model cache root (folder or gs://bucket/prefix).
        revision: Branch, tag or commit for hub sources ("" = default branch).
        token_from: 'env:VAR' or a Secret Manager secret name for gated models ("" = none).
            Never the token itself.
        allow: Only stage files matching these globs ([] = all).
        ignore: Skip files matching these globs.
        model: Output: the verified cache entry, with metadata source, revision,
            architecture, model_type, num_parameters, dtype, total_bytes, cache_hit.
    """
    from components.common.kfp_outputs import write_outputs
    from components.stage_model.step import stage_step

    write_outputs(stage_step(source, cache, revision, token_from, allow, ignore), model=model)
