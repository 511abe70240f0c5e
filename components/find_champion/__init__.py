"""The find_champion component (KFP). Its pure core is `components.find_champion.core`.

The component is imported lazily: inside a running KFP task (`_KFP_RUNTIME=true`)
`kfp.dsl.component` does not exist, and the task imports only the core.
"""

__all__ = ["find_champion"]


def __getattr__(name):
    if name == "find_champion":
        from components.find_champion.component import find_champion

        return find_champion
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
