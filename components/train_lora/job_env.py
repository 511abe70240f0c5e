"""The training job's extra environment (`job_env`): NCCL, torch.distributed and CUDA settings,
and the train-lora plugin's own switches (memory cap, fused LoRA branch, layer compilation).

train-lora applies it to its preflight and to `swift sft` on every node. `check_job_env`
is pure and cheap (no torch), so the configuration loader can call it too, e.g. for

    environment: {NCCL_DEBUG: INFO, NCCL_SOCKET_IFNAME: eth0, NCCL_NVLS_ENABLE: 0}

Names are allow-listed (exact names and prefixes); a reserved name (set by Vertex or the
launcher), an unknown one (the message names the closest allowed names) and anything
that looks like a secret are refused: pipeline parameters are visible in the console.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from components.train_lora._errors import TrainError


class JobEnvError(TrainError):
    """A job environment variable is not allowed (unknown name, reserved, or a secret); the message names the fix."""


# The train-lora plugin's switches: the values each takes (read in components/train_lora/speedups/swift_plugin.py).
_PLUGIN_SWITCHES = {
    "VLM_LORA_FUSED_LORA": "0 (peft's own LoRA forward) or 1 (the fused branch, the default)",
    "VLM_LORA_COMPILE_LAYERS": "1 (compile each decoder layer) or 0 (the default)",
    "VLM_LORA_COMPILE_VISION": "1 (compile each vision block) or 0 (the default)",
    "VLM_LORA_PEFT_INPUT_CAST": "1 (peft's float32 input casts) or 0 (the default)",
    "VLM_LORA_LABEL_ROWS_LOSS": "0 (Liger's loss over every position) or 1 (labelled positions only, the default)",
    "VLM_LORA_RIGHT_PAD_CAUSAL": "0 (transformers' padding mask) or 1 (causal flag for right padding, the default)",
    "VLM_LORA_HOST_VISION_SEQLENS": "0 (the vision tower's grid work on the GPU: boundaries, indices, position ids) "
    "or 1 (on the host, the default)",
    "VLM_LORA_HOST_VISION_GRID": "0 (only the vision boundaries on the host) or 1 (the interpolation indices and "
    "position ids too, cached per image size on the GPU, the default)",
    "VLM_LORA_FORWARD_FACTS": "0 (the forward reads its token counts, padding and deepstack positions from the GPU "
    "where it needs them) or 1 (copied to the host once at its start, the default)",
    "VLM_LORA_BATCH_FACTS": "0 (each batch's copy to the GPU waits, and logits_to_keep and the forward's facts are "
    "read from the GPU) or 1 (read from the batch's host copies, the copies queued without waiting, the default)",
    "VLM_LORA_GRAD_NAN_ON_GPU": "0 (ms-swift reads the gradient norm on the host at every optimizer step) or 1 (a NaN "
    "norm skips the fused optimizer's step on the GPU, the default)",
    "VLM_LORA_LOSS_NO_WAIT": "0 (the loss reads the GPU: the labelled rows, Liger's count of them and its gradient "
    "check) or 1 (from the labels' host copy, without waiting, the default)",
    "VLM_LORA_LIGER_SWIGLU": "0 (PyTorch's SiLU and multiply) or 1 (Liger's fused kernel with Liger on, the default)",
    "VLM_LORA_LEAN_LORA": "0 (the LoRA function without dropout too) or 1 (autograd's own nodes there, the default)",
    "VLM_LORA_TORCH_RMS_NORM": "1 (torch's fused RMSNorm in place of Liger's, on CUDA) or 0 (Liger's); unset: "
    "torch's with more than one process",
    "VLM_LORA_ASYNC_TOKENS": "0 (each micro-step's token count read at once) or 1 (read without waiting, the default)",
    "VLM_LORA_INDEX_DEEPSTACK": "0 (deepstack additions by boolean mask) or 1 (by position, the default)",
    "VLM_LORA_GROUP_LORA": "0 (one rank-r matmul per LoRA layer) or 1 (one per group that reads one input, the default)",
    "VLM_LORA_INPLACE_ADD": "0 (LoRA's product added out of place where the layer runs outside the LoRA function) "
    "or 1 (into the layer's output in place, the default)",
    "VLM_LORA_FUSED_BASE": "0 (the frozen layer before the LoRA function) or 1 (inside it, one input gradient, the default)",
    "VLM_LORA_TRITON_LORA": "0 (PyTorch's kernels for LoRA's backward with dropout) or 1 (Triton's, on a GPU, the default)",
    "VLM_LORA_SEEDED_DROPOUT": "1 (LoRA's dropout masks computed from seeds in the Triton kernels on a GPU, none kept) "
    "or 0 (PyTorch's dropout kernel, a mask kept per adapted layer); unset: the planner decides with auto, else 0",
    "VLM_LORA_CAST_CACHE": "0 (the adapters cast to the compute dtype in every forward) or 1 (their copies kept "
    "and refreshed together after each optimizer step, the default)",
    "VLM_LORA_FOLD_SCALING": "0 (LoRA's scaling as kernels of its own in the backward) or 1 (in the kernels that "
    "already scale, B's float32 gradient from one matmul, on a GPU, the default)",
    "VLM_LORA_SILU_MUL_DOWN": "0 (the MLP's SiLU-multiply output kept for the down projection's LoRA backward) "
    "or 1 (computed again there from gate and up, the default)",
    "VLM_LORA_FAST_VISION": "0 (the vision tower's own Conv3d patch embedding, float32 rotary and norms) "
    "or 1 (one matmul, one Triton rotary kernel, 16-bit norms: the same values, the default)",
    "VLM_LORA_ADAPTER_ONLY_SAVE": "0 (ZeRO-1/2 saves copy the whole model to host memory) "
    "or 1 (only what the adapter save keeps, the default)",
    "VLM_LORA_DDP_COMM": "0 (transformers' DDP defaults: 25 MB gradient buckets, buffers broadcast every forward, "
    "each gradient copied into its bucket and back) or 1 (one bucket for the trainable gradients, no broadcast of "
    "non-persistent buffers, the gradients views of the bucket, the default)",
    "VLM_LORA_DDP_BUCKET_VIEW": "0 (DDP copies each gradient into its bucket and back) "
    "or 1 (the gradients are views of the bucket, the default)",
    "VLM_LORA_ALIGNED_GC": "0 (Python's automatic garbage collection) or 1 (collections at step ends only, also "
    "with one process); unset: at step ends with more than one process",
}


# Variables the training job may get from the config: NCCL / torch.distributed / CUDA
# tuning and debugging. Everything else is refused (the launcher sets the rank variables;
# a secret never belongs in a pipeline parameter).
JOB_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
JOB_ENV_NAMES = frozenset(
    {
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_MODULE_LOADING",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "GLOO_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "LOGLEVEL",
        # the train-lora plugin's memory cap (components/train_lora/speedups/swift_plugin.py)
        "VLM_LORA_GPU_MEMORY_GIB",
        # MLflow tracking (components/common/tracking.py): the server, the experiment, and whether an
        # unreachable server stops the training (0 = train on without MLflow); no credentials
        "MLFLOW_TRACKING_URI",
        "MLFLOW_EXPERIMENT_NAME",
        "VLM_LORA_TRACKING_REQUIRED",
    }
) | frozenset(_PLUGIN_SWITCHES)  # and its switches
# Common names under the prefixes, offered as "did you mean".
_KNOWN_PREFIXED = (
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_SOCKET_IFNAME",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_CROSS_NIC",
    "NCCL_NET_GDR_LEVEL",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)
_RESERVED = {
    "CUDA_VISIBLE_DEVICES": "Vertex and torchrun give each process its GPUs",
    "CLUSTER_SPEC": "Vertex sets it",
    **{
        name: "train-lora sets it from CLUSTER_SPEC and the GPU count"
        for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "RANK", "WORLD_SIZE")
    },
    "LOCAL_RANK": "torchrun sets it",
}
_SECRET_WORDS = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-+/=.]{24,}")
_SECRET_PREFIXES = ("hf_", "ghp_", "gho_", "github_pat_", "sk-", "AKIA", "ya29.", "xox", "AIza", "-----BEGIN")
_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_HEX = re.compile(r"[0-9a-fA-F]{32,}")


def _looks_like_secret(value: str) -> bool:
    """A known key prefix, or a long token-like string: no path, no separators, and either upper and
    lower case letters and digits mixed (API keys, base64) or 32+ hex digits."""
    if value.startswith(_SECRET_PREFIXES):
        return True
    if not _TOKEN_CHARS.fullmatch(value) or value.startswith(("/", ".")):
        return False
    mixed = any(c.isdigit() for c in value) and any(c.isupper() for c in value) and any(c.islower() for c in value)
    return mixed or bool(_HEX.fullmatch(value))


def _name_problem(name: str) -> str:
    """Why a job environment variable name is refused ("" when it is allowed)."""
    if name in _RESERVED:
        return f"{name!r} is reserved ({_RESERVED[name]}); remove it"
    words = set(name.upper().split("_"))
    if words & _SECRET_WORDS:
        return (
            f"{name!r} looks like a secret ({'/'.join(sorted(words & _SECRET_WORDS))} in the name): secrets never go "
            "into pipeline parameters; give the job's service account access instead, or use Secret Manager"
        )
    if _NAME.fullmatch(name) and (name in JOB_ENV_NAMES or name.startswith(JOB_ENV_PREFIXES)):
        return ""
    close = difflib.get_close_matches(name.upper(), sorted(JOB_ENV_NAMES) + list(_KNOWN_PREFIXED), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (
        f"{name!r} is not a variable train-lora passes to the training job; {hint}allowed: names starting with "
        f"{', '.join(JOB_ENV_PREFIXES)} and {', '.join(sorted(JOB_ENV_NAMES))}"
    )


def _switch_problem(name: str, value: Any) -> str:
    """Why a value of one of the plugin's own settings is refused ("" when it is fine or not one of them)."""
    text = job_env_strings({name: value})[name].strip()
    if name in _PLUGIN_SWITCHES and text not in ("0", "1"):
        return f"{value!r} is not a value it takes: use {_PLUGIN_SWITCHES[name]}"
    if name == "VLM_LORA_GPU_MEMORY_GIB":
        try:
            gib = float(text)
        except ValueError:
            gib = 0.0
        if not gib > 0:
            return f"{value!r} is not a memory size: use GiB per GPU as a positive number, e.g. 39.4 for a 40 GB card"
    return ""


def check_job_env(env: Mapping[str, Any], where: str = "job_env") -> None:
    """Checks the extra environment variables of the training job (preflight and `swift sft`).

    Args:
        env: {name: value}; values are strings, numbers or booleans.
        where: The setting's name, for the messages. Default "job_env".

    Raises:
        JobEnvError: A name outside the allow-list (the message names the closest allowed
            names), a reserved name, a name or value that looks like a secret, a value
            that is not a string, number or boolean, or a value the train-lora plugin's
            own settings do not take (a switch other than 0 / 1, a memory cap that is not
            a positive number of GiB).
    """
    if not isinstance(env, Mapping):
        raise JobEnvError(f"{where}: expected a mapping of NAME: value, got {type(env).__name__}")
    for name, value in env.items():
        problem = _name_problem(str(name))
        if problem:
            raise JobEnvError(f"{where}.{name}: {problem}")
        if isinstance(value, dict | list | tuple) or value is None:
            raise JobEnvError(f"{where}.{name}: the value must be a string, number or boolean, got {value!r}")
        switch = _switch_problem(str(name), value)
        if switch:
            raise JobEnvError(f"{where}.{name}: {switch}")
        if isinstance(value, str) and _looks_like_secret(value):
            raise JobEnvError(
                f"{where}.{name}: the value looks like a secret (a long token-like string); secrets never go into "
                "pipeline parameters: remove it and give the job's service account access instead"
            )


def job_env_strings(env: Mapping[str, Any] | None) -> dict[str, str]:
    """Returns the job environment as strings (KFP passes numbers as floats: 0 arrives as 0.0).

    Args:
        env: {name: value}, already checked by `check_job_env`. None = {}.

    Returns:
        {name: text}: booleans as "1"/"0", whole floats as integers.
    """
    out: dict[str, str] = {}
    for name, value in (env or {}).items():
        if isinstance(value, bool):
            out[str(name)] = "1" if value else "0"
        elif isinstance(value, float) and value.is_integer():
            out[str(name)] = str(int(value))
        else:
            out[str(name)] = str(value)
    return out
