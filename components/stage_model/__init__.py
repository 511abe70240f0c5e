"""The stage_model component (KFP). Its pure core is `components.stage_model.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["stage_model"]


def __getattr__(name):
    if name == "stage_model":
        from components.stage_model.component import stage_model

        return stage_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
