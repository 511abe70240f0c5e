"""train-lora's speed-ups of ms-swift / transformers / peft / accelerate / Liger, loaded into `swift sft`.

`swift_plugin.py` is the file `swift sft --external_plugins` loads by path; the items' code is in the
modules beside it. Nothing here imports the component's core (`components.train_lora.core` imports this
package, never the reverse). See docs/speedups.md.
"""
