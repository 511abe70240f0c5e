"""The settings of one preflight run (its command-line options).

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.common.preflight.expectations import DEFAULT_SIZES_MB


# --- the settings ---------------------------------------------------------------------------
@dataclass
class Options:
    """Settings of one preflight run (the command-line options).

    Attributes:
        mode: fail, warn or off. Default fail.
        expect_gpus: GPUs each node must have (0 = no check). Default 0.
        timeout_s: Longest wait for every rank to join, seconds. Default 60.
        op_timeout_s: Timeout of each collective (NCCL / gloo), seconds. Default 60.
        json_path: JSON file with the figures and the verdict ("" = none). Default "".
        sizes_mb: All-reduce sizes, MB (2^20 bytes). Default (4, 32, 256).
        expected_tflops: Override of the table's TFLOP/s (simulates a fault). Default None.
        expected_busbw_gbps: Override of every link's busbw floor, GB/s. Default None.
        device: auto (cuda when available), cuda or cpu. Default auto.
        matmul_n: Matmul size (0 = 8192 on GPU, 256 on CPU). Default 0.
        budget_s: Seconds of each timed loop. Default 1.0.
        nproc: --launch: processes on this node (0 = one per GPU, 1 on CPU). Default 0.
        nnodes, node_rank, master_addr, master_port, hosts: set by --launch for its
            workers: the node's place in a multi-node preflight.
    """

    mode: str = "fail"
    expect_gpus: int = 0
    timeout_s: float = 60.0
    op_timeout_s: float = 60.0
    json_path: str = ""
    sizes_mb: tuple[float, ...] = DEFAULT_SIZES_MB
    expected_tflops: float | None = None
    expected_busbw_gbps: float | None = None
    device: str = "auto"
    matmul_n: int = 0
    budget_s: float = 1.0
    nproc: int = 0
    nnodes: int = 0
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    hosts: tuple[str, ...] = ()

    def worker_args(self) -> list[str]:
        """The options a --launch passes on to its workers (not the node's place)."""
        args = ["--mode", self.mode, "--expect-gpus", str(self.expect_gpus), "--device", self.device]
        args += ["--timeout-s", f"{self.timeout_s:g}", "--op-timeout-s", f"{self.op_timeout_s:g}"]
        args += ["--sizes-mb", ",".join(f"{s:g}" for s in self.sizes_mb), "--budget-s", f"{self.budget_s:g}"]
        args += ["--matmul-n", str(self.matmul_n)]
        if self.json_path:
            args += ["--json", self.json_path]
        if self.expected_tflops is not None:
            args += ["--expected-tflops", f"{self.expected_tflops:g}"]
        if self.expected_busbw_gbps is not None:
            args += ["--expected-busbw", f"{self.expected_busbw_gbps:g}"]
        return args
