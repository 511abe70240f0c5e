"""Host memory for offloaded checkpoints: `VLM_LORA_CHECKPOINT_OFFLOAD=1` (speed-up item 19) holds each checkpointed
decoder layer's input in pinned host memory between its forward and its backward, so a micro-step needs

    micro-batch x longest row x hidden x 2 bytes (bf16) x layers checkpointed

of pinned memory on the host (the 4B at 16 rows of 1,221 tokens with all 36 layers: 3.4 GiB). Pinned pages cannot be
swapped or reclaimed: a host that has less available than that plus `HOST_RESERVE` for the training process itself
(ms-swift, the dataloader's workers, the model's load) is refused before training with the figures, instead of
training into the kernel's out-of-memory killer. L4 machines have 32-64 GB of host memory (g2-standard-8 to -16).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.common.errors import TrainError

OFFLOAD = "VLM_LORA_CHECKPOINT_OFFLOAD"
GIB = 1024**3
HOST_RESERVE = 4 * GIB  # the training process's own host memory besides the offloaded inputs
MEMINFO = Path("/proc/meminfo")


class OffloadHostMemoryError(TrainError):
    """Offloading asked for where the host has too little memory available; the message has both figures."""


def offload_bytes(micro_batch: int, tokens: int, hidden: int, layers: int) -> int:
    """Pinned host bytes one micro-step's offloaded layer inputs take (bf16)."""
    return int(micro_batch) * int(tokens) * int(hidden) * 2 * int(layers)


def available_host_bytes(meminfo: Path | None = None) -> int | None:
    """`MemAvailable` of /proc/meminfo (`MEMINFO`) in bytes; None where the file or the field is missing."""
    try:
        text = (meminfo or MEMINFO).read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            return int(rest.split()[0]) * 1024  # kB
    return None


def check_host_memory(
    environ: Mapping[str, Any],
    *,
    micro_batch: int,
    tokens: int,
    hidden: int,
    layers: int,
    available: int | None,
) -> int:
    """Raises OffloadHostMemoryError when the offload switch is on and `available` host bytes cannot hold one
    micro-step's offloaded inputs plus `HOST_RESERVE`; returns the bytes needed (0 with the switch off or no
    checkpointed layer). `available` None (unknown) passes."""
    if str(environ.get(OFFLOAD, "") or "") != "1" or layers <= 0:
        return 0
    need = offload_bytes(micro_batch, tokens, hidden, layers)
    if available is not None and need + HOST_RESERVE > available:
        raise OffloadHostMemoryError(
            f"{OFFLOAD}=1 holds the checkpointed layers' inputs in pinned host memory: {need / GIB:.1f} GiB for "
            f"micro-batch {micro_batch} x {tokens} tokens x {layers} layers (hidden {hidden}, bf16), plus "
            f"{HOST_RESERVE / GIB:.0f} GiB for the training process, but this host has {available / GIB:.1f} GiB "
            f"available (MemAvailable, /proc/meminfo). Fix: set environment.{OFFLOAD}: '0' (inputs stay on the "
            "GPU), a smaller swift.per_device_train_batch_size, or a machine with more host memory"
        )
    return need
