"""The snapshot_data component (KFP). Its pure core is `components.snapshot_data.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["snapshot_data"]


def __getattr__(name):
    if name == "snapshot_data":
        from components.snapshot_data.component import snapshot_data

        return snapshot_data
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
