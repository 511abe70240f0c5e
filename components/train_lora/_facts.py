"""The facts of one run, computed once: the base model's config, its weight bytes at the run's precision, the
quantisation, the GPUs and nodes, the parallelism strategy and the training set's token figures.

`_input_checks.load_model_config` is train-lora's one reader of config.json (called once a run); `RunFacts.gather` derives the rest from the
config's `swift` section and the launch, and every later step (the argument layers, the speed-up gate, the planner,
the host-memory check, the cost estimate) reads the one `RunFacts` instead of reading the files again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.common.dataset import read_token_stats
from components.common.quantization import quantization_of
from components.train_lora import _input_checks, _launch


@dataclass(frozen=True)
class RunFacts:
    """What one run is, derived once before the arguments are built.

    Attributes:
        model_dir: The staged base model folder.
        config: Its config.json (read once; read, never changed).
        launch: This node's launch plan and GPUs.
        quantization: none, nf4 or int8 (from the swift section's quant_* arguments).
        torch_dtype: The dtype training loads the base in (swift.torch_dtype; None = as stored).
        stored_bytes: Bytes of the safetensors files as stored.
        weight_bytes: Bytes of the frozen base as training holds it (dtype, or bitsandbytes' storage).
        wrapped_bytes: Bytes of the parameters `swift.target_parameters` wraps, in the training dtype (0 = none).
        strategy: The parallelism chosen (`_launch.choose_strategy`).
        token_stats: The training set's token figures (validate-data's token_stats.json; None = none).
    """

    model_dir: str
    config: dict[str, Any]
    launch: _launch.Launch
    quantization: str
    torch_dtype: str | None
    stored_bytes: int
    weight_bytes: int
    wrapped_bytes: int
    strategy: _launch.Strategy
    token_stats: dict[str, Any] | None

    @property
    def world_size(self) -> int:
        """Training processes in all (nodes x processes per node)."""
        return self.launch.plan.world_size

    @property
    def nnodes(self) -> int:
        return self.launch.plan.nnodes

    @property
    def gpus(self) -> int:
        """GPUs of the whole job (GPUs per node x nodes; 0 on a CPU run)."""
        return self.launch.gpu_count * self.launch.plan.nnodes

    def weight_bytes_in(self, torch_dtype: str) -> int:
        """The unquantised base's bytes in `torch_dtype` (the cost estimate counts parameters as bf16)."""
        return _launch.scaled_weight_bytes(self.stored_bytes, self.config, torch_dtype)

    @classmethod
    def gather(
        cls,
        model_dir: str,
        swift_args: Mapping[str, Any],
        launch: _launch.Launch,
        train_dir: str = "",
        *,
        config: dict[str, Any] | None = None,
    ) -> RunFacts:
        """Derives the facts of a run.

        Args:
            model_dir: The staged base model folder.
            swift_args: The config's `swift` section (a `deepspeed` key there is the user's strategy).
            launch: This node's launch plan and GPUs.
            train_dir: The validated training set ("" = no token figures). Default "".
            config: The model's config.json already read. Default None (read here).

        Returns:
            The RunFacts.

        Raises:
            ModelTooLargeError: The base does not fit the job's GPUs even sharded (`_launch.choose_strategy`).
        """
        config = _input_checks.load_model_config(model_dir) if config is None else config
        quantization = quantization_of(dict(swift_args))
        dtype = swift_args.get("torch_dtype")
        stored = _launch.stored_weight_bytes(model_dir)
        weight = (
            _input_checks.quantized_weight_bytes(model_dir, quantization)
            if quantization != "none"
            else _launch.scaled_weight_bytes(stored, config, dtype)
        )
        plan = launch.plan
        strategy = _launch.choose_strategy(
            weight,
            plan.nproc_per_node if launch.gpu_count else 0,
            launch.gpu_memory,
            swift_args,
            nnodes=plan.nnodes,
            deepspeed_available=_launch.deepspeed_importable(),
        )
        return cls(
            model_dir=model_dir,
            config=config,
            launch=launch,
            quantization=quantization,
            torch_dtype=dtype,
            stored_bytes=stored,
            weight_bytes=weight,
            wrapped_bytes=_input_checks.wrapped_parameter_bytes(swift_args, model_dir),
            strategy=strategy,
            token_stats=read_token_stats(train_dir) if train_dir else None,
        )
