"""train-lora's speed-ups of ms-swift / transformers / peft / accelerate / Liger, loaded into `swift sft`.

`swift_plugin.py` is the file `swift sft --external_plugins` loads by path; the items are declared in `items.py`
(read it first), their code is in the modules beside it. The package's version and the library ranges it supports
are in `versions.py` (`__version__`, `SUPPORTED`, `GPU_SUPPORTED`). Nothing here imports train-lora's core
(`components.train_lora.core` imports this package, never the reverse). See docs/speedups.md.
"""

from speedups.versions import GPU_SUPPORTED, SUPPORTED, __version__

__all__ = ["GPU_SUPPORTED", "SUPPORTED", "__version__"]
