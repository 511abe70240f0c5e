"""The snapshot_data component (KFP). Its pure core is `components.snapshot_data.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["nothing_to_train", "snapshot_data"]


def __getattr__(name):
    if name in __all__:
        from components.snapshot_data import component

        return getattr(component, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
