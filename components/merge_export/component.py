"""KFP wrapper of the merge-export core."""

from kfp import dsl

from components.images import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def merge_export(
    base_model: dsl.Input[dsl.Model],
    adapter: dsl.Input[dsl.Model],
    merged_model: dsl.Output[dsl.Model],
):
    """Merges the LoRA adapter into the base model (`swift export --merge_lora true`), verified.

    The adapter must belong to the staged model (architecture, sizes, revision, LoRA shapes),
    and the merged model's logits must match base model + adapter (peft) on probe inputs.

    Args:
        base_model: Staged base model.
        adapter: LoRA adapter from train-lora.
        merged_model: Output: merged model (safetensors, processor, lineage.json, README.md model card).

    No per-run value (job id or name) is an input, so an unchanged run is a cache hit; the
    lineage records the data snapshot instead (`data_snapshot.json`, lineage.json, card).
    """
    from components.common.kfp_outputs import write_outputs
    from components.merge_export.step import merge_step

    write_outputs(merge_step(base_model, adapter, merged_model), merged_model=merged_model)
