"""The validate_data and validate_regression components (KFP). Their pure cores: `core` and `_regression`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["validate_data", "validate_regression"]


def __getattr__(name):
    if name in __all__:
        from components.validate_data import component

        return getattr(component, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
