"""The register component (KFP). Its pure core is `components.register.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["promote", "register"]


def __getattr__(name):
    if name in ("register", "promote"):
        from components.register import component

        return getattr(component, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
