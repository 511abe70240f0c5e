"""The train_lora component (KFP). Its pure core is `components.train_lora.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["train_lora"]


def __getattr__(name):
    if name == "train_lora":
        from components.train_lora.component import train_lora

        return train_lora
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
