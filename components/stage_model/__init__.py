from components.stage_model.component import stage_model

__all__ = ["stage_model"]
