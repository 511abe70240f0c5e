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

from components.common import secrets
from components.common.errors import TrainError
from speedups.registry import REMOVED_SWITCHES, SWITCHES, TABLE_ENV


class JobEnvError(TrainError):
    """A job environment variable is not allowed (unknown name, reserved, or a secret); the message names the fix."""


# The train-lora plugin's switches and the values each takes: declared with the speed-up items
# (speedups/registry.py), the memory cap apart (a size, checked below).
_PLUGIN_SWITCHES = {name: switch.values for name, switch in SWITCHES.items() if switch.flag}


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
        # the train-lora plugin's memory cap (item 11, speedups/memory_cap.py)
        "VLM_LORA_GPU_MEMORY_GIB",
        # MLflow tracking (components/common/tracking.py): the server, the experiment, and whether an
        # unreachable server stops the training (0 = train on without MLflow); no credentials
        "MLFLOW_TRACKING_URI",
        "MLFLOW_EXPERIMENT_NAME",
        "VLM_LORA_TRACKING_REQUIRED",
        # W&B (components/common/wandb_tracking.py): the project, the entity, offline mode, and where the
        # task reads the API key at run time (env:VAR or a Secret Manager name; never the key)
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_MODE",
        "VLM_LORA_WANDB_LOGIN_FROM",
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


def _launch_vars() -> tuple[str, ...]:
    from components.common.cluster import JOBSET_VARS  # _launch imports torch-free modules only

    return JOBSET_VARS


_RESERVED = {
    "CUDA_VISIBLE_DEVICES": "Vertex and torchrun give each process its GPUs",
    "CLUSTER_SPEC": "Vertex sets it",
    **{
        name: "train-lora sets it from CLUSTER_SPEC and the GPU count"
        for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "RANK", "WORLD_SIZE")
    },
    "LOCAL_RANK": "torchrun sets it",
    **{name: "Kubernetes and the JobSet manifest set it" for name in _launch_vars()},
    TABLE_ENV: "train-lora sets it, for the plugin's start-up table",
}
_SECRET_WORDS = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-+/=.]{24,}")
_SECRET_PREFIXES = ("hf_", "ghp_", "gho_", "github_pat_", "sk-", "AKIA", "ya29.", "xox", "AIza", "-----BEGIN")
_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_HEX = re.compile(r"[0-9a-fA-F]{32,}")


def _looks_like_secret(value: str) -> bool:
    """A known key prefix, or a long token-like string: no path, no separators, and either upper and
    lower case letters and digits mixed (API keys, base64) or 32+ hex digits."""
    if value.startswith(_SECRET_PREFIXES) or secrets.find_secret(value, free_text=True):
        return True
    if not _TOKEN_CHARS.fullmatch(value) or value.startswith(("/", ".")):
        return False
    mixed = any(c.isdigit() for c in value) and any(c.isupper() for c in value) and any(c.islower() for c in value)
    return mixed or bool(_HEX.fullmatch(value))


def _name_problem(name: str) -> str:
    """Why a job environment variable name is refused ("" when it is allowed)."""
    if name in _RESERVED:
        return f"{name!r} is reserved ({_RESERVED[name]}); remove it"
    if name in REMOVED_SWITCHES:
        return f"{name!r}: the train-lora plugin's {REMOVED_SWITCHES[name]}"
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
