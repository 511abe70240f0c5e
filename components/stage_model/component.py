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
    from components.stage_model.core import StageError, result_summary
    from components.stage_model.core import stage_model as stage

    try:
        result = stage(
            source,
            cache,
            allow or None,
            ignore or None,
            revision=revision or None,
            token_from=token_from or None,
            progress=True,  # rate-limited lines in the task's log: one per 5 % or 30 s
        )
    except StageError as exc:
        raise SystemExit(f"stage-model: {exc}") from None
    model.uri = result.entry
    model.metadata.update(result_summary(result))
    print(
        f"stage-model: {'cache hit' if result.cache_hit else 'staged'} {result.entry} "
        f"({result.bytes_copied} bytes copied)"
    )
