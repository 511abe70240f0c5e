from components.validate_data.component import validate_data

__all__ = ["validate_data"]
