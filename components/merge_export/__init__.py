"""The merge_export component (KFP). Its pure core is `components.merge_export.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["merge_export"]


def __getattr__(name):
    if name == "merge_export":
        from components.merge_export.component import merge_export

        return merge_export
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
