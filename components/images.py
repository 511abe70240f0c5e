"""Container images of the pipeline's tasks: the one place their tags live.

Both images are built from `images/` (see images/README.md) with the project installed
from `requirements.lock` (no model weights). Which tag a compiled pipeline uses, first
match wins:

1. the config's `images.light` / `images.train`,
2. the environment variables `VLM_LORA_LIGHT_IMAGE` / `VLM_LORA_TRAIN_IMAGE`,
3. the defaults below (`REGISTRY`, `TAG`; `images/cloudbuild.yaml` pushes the same tags).

Locally (kfp.local) tasks run in the current Python environment and no image is used.
"""

import os

REGISTRY = "us-docker.pkg.dev/YOUR_PROJECT/vlm-lora"
TAG = "0.1.0"

# CPU image for staging, validation and registration.
LIGHT_IMAGE = os.environ.get("VLM_LORA_LIGHT_IMAGE", f"{REGISTRY}/light:{TAG}")
# CUDA image with torch, ms-swift, deepspeed, liger-kernel and flash-attn for train/merge/eval.
TRAIN_IMAGE = os.environ.get("VLM_LORA_TRAIN_IMAGE", f"{REGISTRY}/train:{TAG}")


def resolve_images(light: str = "", train: str = "") -> dict[str, str]:
    """Returns {"light": uri, "train": uri}: the overrides where given, else the defaults above."""
    return {"light": light or LIGHT_IMAGE, "train": train or TRAIN_IMAGE}
