"""The evaluate component (KFP). Its pure core is `components.evaluate.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["evaluate"]


def __getattr__(name):
    if name == "evaluate":
        from components.evaluate.component import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
