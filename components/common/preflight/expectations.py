"""What a healthy GPU and link measure (one row per GPU type), the modes, and the preflight's errors.

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.common.errors import TrainError

MODES = ("fail", "warn", "off")
# A GPU below this share of its expected TFLOP/s fails.
FAIL_FRACTION = 0.5
# Free memory below this share of the total, before the check allocates anything, fails:
# another process (a stale run, a stuck notebook) holds the GPU. A CUDA context is < 1 GiB.
MIN_FREE_FRACTION = 0.85
INTER_NODE_BUSBW_FLOOR_GBPS = 1.0
# Gradients of the DDP step may differ by this much (relative to their size) between ranks.
GRAD_TOLERANCE = 1e-4
DEFAULT_SIZES_MB = (4.0, 32.0, 256.0)
# The preflight's own rendezvous port on a multi-node job: the training port (CLUSTER_SPEC) + this.
PORT_OFFSET = 1
MODULE = "components.common.preflight"

NCCL_KNOBS = (
    "NCCL knobs to check (set them in the config's job environment): NCCL_SOCKET_IFNAME (the network "
    "interface NCCL uses between nodes; a wrong one means loopback or a slow management NIC), NCCL_DEBUG=INFO "
    "(with NCCL_DEBUG_SUBSYS=INIT,NET: read the log lines of the failing all-reduce: which transport, NET/IB, "
    "NET/Socket, P2P or SHM, and which interface), NCCL_P2P_DISABLE=1 (rules out peer-to-peer between GPUs). "
    "To train anyway, set resources.preflight: warn."
)


@dataclass(frozen=True)
class GpuSpec:
    """What a healthy GPU of one type achieves (see the module docstring for the sources).

    Attributes:
        pattern: Regular expression searched in torch.cuda.get_device_name().
        label: Short name for messages.
        tflops: Expected dense bf16 matmul TFLOP/s (8192³).
        link: "nvlink" or "pcie": how the GPUs of one node are connected.
        intra_busbw_gbps: Floor of the intra-node all-reduce busbw at the largest size, GB/s.
        source: Where `tflops` comes from.
    """

    pattern: str
    label: str
    tflops: float
    link: str
    intra_busbw_gbps: float
    source: str


GPU_TABLE: tuple[GpuSpec, ...] = (
    GpuSpec(r"\bH100\b.*PCIe", "H100 PCIe", 530.0, "pcie", 5.0, "datasheet peak 756, derated like H100 SXM"),
    GpuSpec(r"\bH100\b.*HBM3", "H100 SXM", 700.0, "nvlink", 100.0, "measured 679-713 by this check, peak 989"),
    GpuSpec(r"\bH200\b(?!.*NVL)", "H200 SXM", 675.0, "nvlink", 100.0, "measured 666-682 by this check, peak 989"),
    # B200: NVIDIA HGX B200 datasheet, BF16 tensor core 4.5 PFLOP/s with sparsity = 2,250 dense per GPU;
    # NVLink 5 (1.8 TB/s). Not measured here: derated like the H100 SXM (700 of 989) and the NVLink 4 floor kept.
    GpuSpec(r"\bB200\b", "B200", 1600.0, "nvlink", 100.0, "datasheet dense peak 2250, derated 0.71 like H100"),
    GpuSpec(r"\bA100\b.*PCIe", "A100 PCIe", 250.0, "pcie", 5.0, "datasheet peak 312, derated 0.8"),
    GpuSpec(r"\bA100\b", "A100 SXM", 250.0, "nvlink", 60.0, "datasheet peak 312, derated 0.8"),
    GpuSpec(r"\bL4\b", "L4", 85.0, "pcie", 5.0, "datasheet peak 121 (dense), derated 0.7 (72 W power limit)"),
)


class PreflightFailed(TrainError):
    """A GPU or link check failed; the message names node, host, GPU, the figure vs its expected value."""


class RendezvousTimeout(PreflightFailed):
    """Not every rank joined the preflight within the timeout; the message names the missing ranks."""


class PreflightSettingError(TrainError):
    """A preflight setting (the mode) is invalid; the message names the key and the fix."""


def check_mode(mode: str, where: str = "resources.preflight") -> None:
    """Refuses a preflight mode other than fail, warn or off.

    Args:
        mode: The mode.
        where: The setting's name, for the message. Default "resources.preflight".

    Raises:
        PreflightSettingError: Unknown mode.
    """
    if mode not in MODES:
        raise PreflightSettingError(f"{where}: {mode!r} is not a preflight mode; use one of {', '.join(MODES)}")
