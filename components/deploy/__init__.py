"""The deploy component (KFP). Its pure core is `components.deploy.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["deploy"]


def __getattr__(name):
    if name == "deploy":
        from components.deploy.component import deploy

        return deploy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
