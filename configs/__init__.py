"""The shipped configs (YAML), installed with the project so `vlm-lora ls` / `--config NAME` find them.

Not code: this file only makes the folder part of the install (`pipelines.config.shipped_configs`).
"""
