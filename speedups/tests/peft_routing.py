"""peft's LoRA layers routed through the train-lora plugin's fused branch (or peft's own forward) in tests."""

from __future__ import annotations

import contextlib

from peft.tuners.lora.layer import Linear as LoraLinear

from speedups import fused_lora


def peft_forward():
    """peft's own forward, also where the plugin has patched it in this process."""
    return getattr(LoraLinear.forward, "_vlm_lora_original", LoraLinear.forward)


@contextlib.contextmanager
def routed(fused: bool):
    """Inside: peft's LoRA layers run `fused_lora.fused_forward` (falling back to peft's forward), as the plugin
    installs it, or peft's own forward (`fused` False)."""
    original = LoraLinear.forward
    own = peft_forward()
    LoraLinear.forward = own
    if fused:

        def forward(self, inp, *args, **kwargs):
            out = fused_lora.fused_forward(self, inp, *args, **kwargs)
            return own(self, inp, *args, **kwargs) if out is None else out

        LoraLinear.forward = forward
    try:
        yield
    finally:
        LoraLinear.forward = original
