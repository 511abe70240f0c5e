"""KFP wrapper of the stage-model core."""

from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def stage_model(source: str, cache: str, model: dsl.Output[dsl.Model]):
    """Stages the base model into the model cache and points the Model artifact at it.

    Args:
        source: Model folder (or, later, hf:// ms:// gs:// URI).
        cache: Model cache root.
        model: Output: the verified cache entry, with metadata source, revision,
            architecture, model_type, num_parameters, dtype, total_bytes, cache_hit.
    """
    from components.stage_model.core import result_summary, stage_model as stage

    result = stage(source, cache)
    model.uri = result.entry
    model.metadata.update(result_summary(result))
    print(f"stage-model: {'cache hit' if result.cache_hit else 'staged'} {result.entry} "
          f"({result.bytes_copied} bytes copied)")
