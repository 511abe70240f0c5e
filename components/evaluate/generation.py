"""How evaluate gets a model's answers: ms-swift's TransformersEngine, greedy and batched, timed.

`swift_generate` is the real generator (bf16, or quantised by bitsandbytes with the settings
ms-swift builds for a QLoRA base); `generate_answers` runs any generator (tests pass a fake)
over every row and returns its answers with the speed figures evaluate records.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable
from typing import Any

from components.common.progress import Progress
from components.common.quantization import QUANTIZATIONS, check_runnable, swift_quant_args
from components.evaluate.result import EvalError

# (model_dir, model_type, rows, batch_size, max_new_tokens) -> (answers, generated tokens); a generator
# that also takes `progress_label` logs its own progress (rows done / total, rows/s, ETA) under that label;
# one that loads models quantised takes `quantization` and `timings` (it sets timings["quantized_layers"])
GenerateFn = Callable[[str, str, list[dict[str, Any]], int, int], tuple[list[str], int]]


def swift_generate(
    model_dir: str,
    model_type: str,
    rows: list[dict[str, Any]],
    batch_size: int,
    max_new_tokens: int,
    timings: dict[str, float] | None = None,
    max_pixels: int = 0,
    progress_label: str = "",
    quantization: str = "none",
) -> tuple[list[str], int]:
    """Generates greedy answers with ms-swift's TransformersEngine (batched, KV cache).

    Args:
        timings: If given, receives load_s and generate_s (seconds) and, quantised,
            quantized_layers (the loaded model's bitsandbytes layers). Default None.
        max_pixels: The training run's `swift.max_pixels`: images are shrunk as in training
            (the template's own rescale); 0 = full size. Default 0.
        progress_label: With a label, logs the load time, then rows done / total, rows/s and
            the ETA after each batch, at most one line per 5 % or 30 s (whichever comes later;
            `components.common.progress`). "" = silent. Default "".
        quantization: "none" (bf16; float32 on a CPU), or "nf4" / "int8": loaded quantised by
            bitsandbytes (`swift_quantization_config`). Default "none".

    Returns:
        (answers in row order, number of generated tokens).
    """
    import torch
    from swift.infer_engine import InferRequest, RequestConfig, TransformersEngine

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    start = time.time()
    quantized = {}
    if quantization != "none":
        quantized["quantization_config"] = swift_quantization_config(model_dir, model_type, dtype, quantization)
    engine = TransformersEngine(
        model_dir, model_type=model_type or None, torch_dtype=dtype, max_batch_size=batch_size, **quantized
    )
    if max_pixels:
        engine.template.max_pixels = int(max_pixels)  # what `swift sft --max_pixels` set on training's template
    loaded = time.time()
    if progress_label:
        print(f"{progress_label}: loaded in {loaded - start:.1f} s", file=sys.stderr, flush=True)
    requests = [InferRequest(messages=r["messages"], images=r["images"]) for r in rows]
    config = RequestConfig(max_tokens=max_new_tokens, temperature=0.0)
    step = max(1, batch_size)
    responses = []
    with Progress(progress_label, len(requests), "rows", enabled=bool(progress_label)) as progress:
        for i in range(0, len(requests), step):  # one batch at a time, as the engine would: progress per batch
            responses += engine.infer(requests[i : i + step], config, use_tqdm=False)
            progress.update(len(requests[i : i + step]))
    answers = [resp.choices[0].message.content or "" for resp in responses]
    generated = sum(resp.usage.completion_tokens for resp in responses)
    if timings is not None:
        timings.update(load_s=loaded - start, generate_s=time.time() - loaded)
        if quantization != "none":
            timings["quantized_layers"] = quantized_layers(engine.model)
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return answers, generated


def swift_quantization_config(model_dir: str, model_type: str, dtype: Any, quantization: str) -> Any:
    """The `BitsAndBytesConfig` ms-swift loads a model with for `--quant_method bnb` (`swift infer` as `swift sft`).

    ms-swift's own argument handling (`BaseArguments.get_quantization_config`, what `swift infer
    --infer_backend transformers` passes to its TransformersEngine) from `swift_quant_args`: for
    Qwen3-VL its `llm_int8_skip_modules` keep the vision tower, its mergers and `lm_head` unquantised
    (a bare `BitsAndBytesConfig` would quantise the vision tower's linear layers too). The folder's
    own `args.json` (a merged model keeps its training's) is not read: the setting alone decides.

    Args:
        model_dir: The model folder.
        model_type: ms-swift model_type ("" = from the folder's config).
        dtype: The torch dtype the unquantised layers load in.
        quantization: "nf4" or "int8".

    Returns:
        The transformers BitsAndBytesConfig.
    """
    from swift.arguments import BaseArguments

    dtype_name = str(dtype).removeprefix("torch.")
    args = BaseArguments(
        model=model_dir,
        model_type=model_type or None,
        torch_dtype=dtype_name,
        load_args=False,  # a merged model's training args.json would force its own bnb_4bit_* settings
        **swift_quant_args(quantization),
    )
    return args.get_quantization_config()


def quantized_layers(model: Any) -> int:
    """How many bitsandbytes layers (`Linear4bit`, `Linear8bitLt`) a loaded model holds."""
    import bitsandbytes as bnb

    return sum(isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) for m in model.modules())


def _takes(fn: Callable, name: str) -> bool:
    """Whether a generator takes the keyword `name` (progress_label, quantization, timings)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def generate_answers(
    name: str,
    model_dir: str,
    model_type: str,
    rows: list[dict[str, Any]],
    batch_size: int,
    max_new_tokens: int,
    generate_fn: GenerateFn,
    quantization: str = "none",
) -> tuple[list[str], dict[str, float]]:
    """One model's answers to every row (held-out and regression, one call), and its figures.

    Returns:
        (answers, {samples_per_second, generated_tokens_per_second, generate_seconds}, and
        quantised also quantized_layers: the loaded model's bitsandbytes layers).

    Raises:
        EvalError: The model returned another number of answers than rows; quantised, a generator
            that cannot load models quantised, or a model loaded without any bitsandbytes layer.
    """
    label = f"evaluate: {name} model"
    loaded: dict[str, float] = {}
    extra: dict[str, Any] = {}
    if quantization != "none":
        if not (_takes(generate_fn, "quantization") and _takes(generate_fn, "timings")):
            raise EvalError(
                f"eval.quantization {quantization}: the generator {getattr(generate_fn, '__name__', generate_fn)!r} "
                "cannot load models quantised (it takes no quantization / timings); use swift_generate"
            )
        extra = {"quantization": quantization, "timings": loaded}
    start = time.time()
    if _takes(generate_fn, "progress_label"):
        answers, generated = generate_fn(
            model_dir, model_type, rows, batch_size, max_new_tokens, progress_label=label, **extra
        )
    else:  # a generator that logs nothing itself: a line before, a line after
        with Progress(label, len(rows), "rows") as progress:
            answers, generated = generate_fn(model_dir, model_type, rows, batch_size, max_new_tokens, **extra)
            progress.update(len(answers))
    seconds = max(time.time() - start, 1e-9)
    if len(answers) != len(rows):
        raise EvalError(f"{name} model returned {len(answers)} answers for {len(rows)} prompts")
    figures = {
        "samples_per_second": len(rows) / seconds,
        "generated_tokens_per_second": generated / seconds,
        "generate_seconds": seconds,
    }
    if quantization != "none":
        layers = int(loaded.get("quantized_layers") or 0)
        if layers <= 0:
            raise EvalError(
                f"eval.quantization {quantization}: the {name} model {model_dir} was loaded without any bitsandbytes "
                "layer, so its scores would not be those of a quantised model; set eval.quantization: none"
            )
        figures["quantized_layers"] = float(layers)
    return answers, figures


def check_quantization(quantization: str) -> None:
    """Refuses an unknown setting; quantised, probes that bitsandbytes runs on this machine (before any load).

    Raises:
        EvalError: Not one of QUANTIZATIONS.
        QuantizationUnavailable: bitsandbytes is missing or cannot quantise and run a layer here.
    """
    if quantization not in QUANTIZATIONS:
        raise EvalError(f"eval.quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    check_runnable(quantization, "eval.quantization", "resources.eval_accelerator_type")
