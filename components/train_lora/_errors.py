"""The train-lora error types (in their own module so the private helpers can raise them)."""


class TrainError(RuntimeError):
    """Training could not start or failed; the message says why and which knob to turn."""
