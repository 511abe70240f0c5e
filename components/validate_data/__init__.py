"""The validate_data component (KFP). Its pure core is `components.validate_data.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["validate_data"]


def __getattr__(name):
    if name == "validate_data":
        from components.validate_data.component import validate_data

        return validate_data
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
