from components.evaluate.component import evaluate

__all__ = ["evaluate"]
