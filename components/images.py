"""Container images of the pipeline's tasks: the one place their tags live.

Both images are built from `images/` with the project and its lock file installed (no
model weights). Override the registry/tag at compile time with the environment variables
`VLM_LORA_LIGHT_IMAGE` and `VLM_LORA_TRAIN_IMAGE`; locally (kfp.local) tasks run in the
current Python environment and the image is not used.
"""

import os

_REGISTRY = "us-docker.pkg.dev/YOUR_PROJECT/vlm-lora"
_TAG = "0.1.0"

# CPU image for staging, validation and light bookkeeping.
LIGHT_IMAGE = os.environ.get("VLM_LORA_LIGHT_IMAGE", f"{_REGISTRY}/light:{_TAG}")
# CUDA image with torch, ms-swift, deepspeed and liger-kernel for train/merge/eval.
TRAIN_IMAGE = os.environ.get("VLM_LORA_TRAIN_IMAGE", f"{_REGISTRY}/train:{_TAG}")
