"""Serving a merged 4B-shaped Qwen3-VL on one GPU: `swift deploy` load time, latency, tokens/s, memory.

Runs on the GPU machine (not a test; `--tiny` is the CPU check). Builds the real
Qwen3-VL-4B-Instruct architecture with random bf16 weights (benchmarks/qwen3_vl_4b.py, in a
child process so that this one never holds GPU memory) as a merged-model folder, or takes
one with `--model DIR`, then:

1. starts `components.deploy.local_server.LocalServer` on it (`swift deploy`, transformers backend,
   served name "tuned"; it uses the GPU when one is visible) and times its start-up,
2. sends `--requests` chat requests (one 1024x1024 synthetic drawing + the detection prompt,
   from pipelines/demo/drawings.py) one at a time through the official `openai` client and
   reads `usage` of each reply: latency (first request apart, p50/p90 of the rest), prompt
   and completion tokens, generated tokens/s,
3. samples `nvidia-smi --query-gpu=memory.used` while the server runs (peak, and the idle
   baseline before it started),
4. runs the deploy task's smoke test (`run_smoke`, task "" = any non-empty text) on 2 rows.

The server is stopped in a `finally`. Prints a Markdown table and `SERVE {json}`; the same
figures go to OUT/serve_summary.json.

    python3 -m benchmarks.serve_4b --out /tmp/serve [--requests 8] [--max-tokens 128] [--model DIR] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

SERVED_NAME = "tuned"
SUMMARY_NAME = "serve_summary.json"
SMOKE_ROWS = 2


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None when empty."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_memory_used_mib() -> list[int] | None:
    """`nvidia-smi --query-gpu=memory.used` per GPU, MiB; None without nvidia-smi (or when it fails)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return [int(float(line)) for line in out.split() if line.strip()]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def gpu_name() -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "cpu"
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return f"{len(names)}x {names[0]}" if len(names) > 1 else (names[0] if names else "cpu")


class GpuMemorySampler:
    """Polls nvidia-smi in a thread; `peak_mib` is the largest total (all GPUs) seen."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.peak_mib: int | None = None
        self.peak_per_gpu: list[int] | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int | None:
        used = gpu_memory_used_mib()
        if used is None:
            return None
        self.samples += 1
        total = sum(used)
        if self.peak_mib is None or total > self.peak_mib:
            self.peak_mib, self.peak_per_gpu = total, used
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> GpuMemorySampler:
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._run, name="gpu-memory", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)


def ensure_swift_on_path() -> None:
    """Puts the `bin/` of a `pip install --target` folder on PATH when `swift` is found only there.

    On the GPU machine ms-swift is carried as wheels installed with `--target /tmp/site` and
    PYTHONPATH=/tmp/site: its `swift` launcher is then /tmp/site/bin/swift, which neither
    sits beside sys.executable nor is on PATH.
    """
    if (Path(sys.executable).parent / "swift").exists() or shutil.which("swift"):
        return
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / "swift"
        if candidate.is_file():
            os.environ["PATH"] = f"{candidate.parent}{os.pathsep}{os.environ.get('PATH', '')}"
            return


def prepare_model(args: argparse.Namespace, out: Path) -> tuple[Path, float, str]:
    """Returns (model folder, seconds spent building it, where it came from)."""
    if args.model:
        return Path(args.model), 0.0, "given"
    start = time.monotonic()
    if args.tiny:
        from pipelines.demo.tiny_model import ensure_tiny_model

        return Path(ensure_tiny_model()), round(time.monotonic() - start, 1), "tiny"
    model_dir = out / "merged"
    if args.reuse and (model_dir / "config.json").is_file():
        return model_dir, 0.0, "reused"
    # A child process: the build's CUDA memory is gone before the server starts.
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "benchmarks.qwen3_vl_4b", str(model_dir)], check=True, cwd=root)
    return model_dir, round(time.monotonic() - start, 1), "built (random bf16 Qwen3-VL-4B architecture)"


def make_rows(out: Path, n: int, image_size: int) -> list[dict[str, Any]]:
    """n synthetic drawing rows (image + detection prompt) as `load_rows` gives them."""
    from components.deploy.smoke import load_rows
    from pipelines.demo.drawings import generate_dataset

    data = generate_dataset(out / "rows", n_train=0, n_eval=n, image_size=image_size, seed=0)
    return load_rows(data["eval"], limit=n)


def timed_requests(
    base_url: str, rows: Sequence[dict[str, Any]], n: int, max_tokens: int, timeout_s: float
) -> list[dict[str, Any]]:
    """Sends n chat requests one at a time (rows in turn); per request: seconds and usage."""
    import openai

    from components.deploy.smoke import build_messages

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=timeout_s, max_retries=0)
    results = []
    for i in range(n):
        messages = build_messages(rows[i % len(rows)])
        t0 = time.perf_counter()
        reply = client.chat.completions.create(
            model=SERVED_NAME, messages=messages, max_tokens=max_tokens, temperature=0.0
        )
        seconds = time.perf_counter() - t0
        usage = reply.usage
        completion = int(usage.completion_tokens) if usage else 0
        results.append(
            {
                "request": i,
                "seconds": round(seconds, 3),
                "prompt_tokens": int(usage.prompt_tokens) if usage else 0,
                "completion_tokens": completion,
                "tokens_per_s": round(completion / seconds, 2) if seconds > 0 else 0.0,
                "finish_reason": reply.choices[0].finish_reason,
                "answer_chars": len(reply.choices[0].message.content or ""),
            }
        )
        print(f"request {i}: {seconds:.2f} s, {completion} tokens", flush=True)
    return results


def latency_figures(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """First request apart, p50/p90 of the rest, tokens/s per request and overall."""
    if not results:
        return {}
    seconds = [r["seconds"] for r in results]
    rest = seconds[1:]
    completion = [r["completion_tokens"] for r in results]
    rates = [r["tokens_per_s"] for r in results]
    total_s = sum(seconds)

    def rnd(value: float | None, digits: int = 3) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "requests": len(results),
        "first_request_s": seconds[0],
        "rest_p50_s": rnd(percentile(rest, 50)),
        "rest_p90_s": rnd(percentile(rest, 90)),
        "rest_mean_s": rnd(sum(rest) / len(rest)) if rest else None,
        "prompt_tokens": sorted({r["prompt_tokens"] for r in results}),
        "completion_tokens": completion,
        "completion_tokens_total": sum(completion),
        "tokens_per_s_per_request": rates,
        "rest_tokens_per_s_p50": rnd(percentile(rates[1:], 50), 2),
        "tokens_per_s_overall": round(sum(completion) / total_s, 2) if total_s > 0 else 0.0,
        "requests_total_s": round(total_s, 3),
    }


def markdown_table(summary: dict[str, Any]) -> str:
    lat = summary.get("latency") or {}
    mem = summary.get("gpu_memory_mib") or {}
    smoke = summary.get("smoke") or {}

    def fmt(value: Any, unit: str = "") -> str:
        return "n/a" if value is None else f"{value}{unit}"

    rows = [
        ("device", summary.get("device")),
        ("model", f"{summary.get('model_source')}: {summary.get('model_dir')}"),
        ("build model", fmt(summary.get("build_model_s"), " s")),
        ("server start-up (`swift deploy` until /health answers)", fmt(summary.get("load_s"), " s")),
        ("requests (one at a time, greedy)", f"{lat.get('requests')} × max_tokens {summary.get('max_tokens')}"),
        ("prompt tokens (image + text)", fmt(lat.get("prompt_tokens"))),
        ("completion tokens per request", fmt(lat.get("completion_tokens"))),
        ("first request latency", fmt(lat.get("first_request_s"), " s")),
        ("latency of the rest: p50 / p90", f"{fmt(lat.get('rest_p50_s'), ' s')} / {fmt(lat.get('rest_p90_s'), ' s')}"),
        ("generated tokens/s per request", fmt(lat.get("tokens_per_s_per_request"))),
        ("generated tokens/s overall", fmt(lat.get("tokens_per_s_overall"))),
        (
            "GPU memory used (nvidia-smi): idle / after load / peak",
            f"{fmt(mem.get('idle'))} / {fmt(mem.get('after_load'))} / {fmt(mem.get('peak'))} MiB",
        ),
        ('smoke test (task "", 2 rows)', "passed" if smoke.get("passed") else f"FAILED: {smoke.get('error')}"),
    ]
    lines = ["| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "transformers", "ms-swift", "peft", "openai"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder (model, rows, server log, summary)")
    parser.add_argument("--requests", type=int, default=8, help="timed chat requests, one at a time")
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request")
    parser.add_argument("--model", default="", help="serve this merged-model folder instead of building one")
    parser.add_argument("--tiny", action="store_true", help="CPU check: the project's tiny model, 256 px images")
    parser.add_argument("--image-size", type=int, default=0, help="drawing side, px (default 1024; 256 with --tiny)")
    parser.add_argument("--rows", type=int, default=4, help="distinct drawings the requests cycle through")
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="longest wait for the server, s")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="per-request timeout, s")
    parser.add_argument("--no-reuse", dest="reuse", action="store_false", help="rebuild OUT/merged if present")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1:
        parser.error("--requests and --max-tokens must be >= 1")

    from components.deploy.errors import SmokeTestError
    from components.deploy.local_server import LocalServer
    from components.deploy.smoke import openai_ask, run_smoke

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    image_size = args.image_size or (256 if args.tiny else 1024)
    if not args.tiny:
        # 1024x1024 -> 1024 image tokens, as the training/evaluate benchmarks use
        os.environ.setdefault("MAX_PIXELS", str(1024 * 1024))
    ensure_swift_on_path()

    summary: dict[str, Any] = {
        "device": gpu_name(),
        "versions": versions(),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "image_size": image_size,
        "served_model_name": SERVED_NAME,
    }
    model_dir, build_s, source = prepare_model(args, out)
    summary.update(model_dir=str(model_dir), model_source=source, build_model_s=build_s)
    weights = list(model_dir.glob("*.safetensors"))
    summary["model_safetensors_bytes"] = sum(p.stat().st_size for p in weights)
    rows = make_rows(out, max(SMOKE_ROWS, min(args.rows, args.requests)), image_size)

    idle = gpu_memory_used_mib()
    sampler = GpuMemorySampler().start()
    server = LocalServer(
        model_dir,
        args.port or _free_port(),
        out / "server.log",
        start_timeout_s=args.start_timeout,
        served_model_name=SERVED_NAME,
    )
    status = 0
    after_load = None
    try:
        t0 = time.monotonic()
        waited = server.start()
        summary["load_s"] = round(time.monotonic() - t0, 2)
        summary["load_health_wait_s"] = waited
        after_load = sampler.sample()
        results = timed_requests(server.base_url, rows, args.requests, args.max_tokens, args.request_timeout)
        summary["per_request"] = results
        summary["latency"] = latency_figures(results)
        ask = openai_ask(
            server.base_url, SERVED_NAME, timeout_s=args.request_timeout, max_tokens=max(16, args.max_tokens)
        )
        try:
            smoke = run_smoke(ask, rows[:SMOKE_ROWS], "")
            summary["smoke"] = {"passed": True, "rows": len(smoke.answers), "seconds": smoke.seconds}
        except SmokeTestError as exc:
            summary["smoke"] = {"passed": False, "error": str(exc)}
            status = 1
    finally:
        sampler.sample()
        server.stop()
        sampler.stop()
        idle_mib = sum(idle) if idle is not None else None
        summary["gpu_memory_mib"] = {
            "idle": idle_mib,
            "after_load": after_load,
            "peak": sampler.peak_mib,
            "peak_per_gpu": sampler.peak_per_gpu,
            "peak_minus_idle": None if idle_mib is None or sampler.peak_mib is None else sampler.peak_mib - idle_mib,
            "samples": sampler.samples,
        }
        (out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=str))
    print(markdown_table(summary))
    print("SERVE " + json.dumps(summary, default=str), flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
