"""The training job's error type, shared by train-lora and the building blocks it runs (the launch's cluster parsing,
the preflight): one base, so that train-lora reports each of them the same way."""


class TrainError(RuntimeError):
    """Training could not start or failed; the message says why and which knob to turn."""
