"""Loaded into `swift sft` through `--external_plugins` by the train-lora task.

transformers counts the tokens a model saw (`num_input_tokens_seen`, and from it
`train_tokens_per_second`) either with padding or without, but its command-line parser
only accepts true/false for `include_num_input_tokens_seen`, and true counts padding. With
batches of more than one sample that inflates tokens/s by the padding. This plugin makes
the count exclude padding whenever the batch has an attention mask: the task's tokens/s
is then the language-model tokens (text + image tokens) actually trained on.
"""

from __future__ import annotations


def _install() -> bool:
    try:
        import torch
        from transformers import Trainer
    except ImportError:
        return False
    original = getattr(Trainer, "_track_num_input_tokens", None)
    if original is None or getattr(original, "_vlm_lora_non_padding", False):
        return original is not None

    def _track_num_input_tokens(self, inputs):
        mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
        if self.args.include_num_input_tokens_seen == "no" or mask is None or mask.dim() != 2:
            return original(self, inputs)
        count = torch.as_tensor(mask.sum(), device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += self.accelerator.gather(count).sum().item()
        return None

    _track_num_input_tokens._vlm_lora_non_padding = True
    Trainer._track_num_input_tokens = _track_num_input_tokens
    return True


INSTALLED = _install()
