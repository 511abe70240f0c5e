from components.merge_export.component import merge_export

__all__ = ["merge_export"]
