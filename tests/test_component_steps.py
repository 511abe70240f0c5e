"""The thin wrappers of train-lora, stage-model and merge-export: each body one call, the step's outputs written.

Each step runs with its core replaced by a recording fake (stage-model: the real core on a tiny
local model), once on plain stand-in artifacts (path, uri, metadata) and once through the real
component function with KFP's own artifact classes, so a broken step, helper or wrapper fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kfp import dsl

import components.merge_export.step as merge_step_mod
import components.train_lora.step as train_step_mod
from components.common import tracking, wandb_tracking
from components.common.kfp_outputs import write_outputs
from components.common.kube_jobs import JobSetFailed
from components.merge_export.errors import AdapterBaseMismatch
from components.train_lora.core import TrainError, TrainResult, durable_checkpoint_dir
from tests.test_stage_model import make_model

MODEL_META = {
    "source": "hf://Qwen/Qwen3-VL-2B",
    "revision": "abc123",
    "architecture": "Qwen3VL",
    "model_type": "qwen3_vl",
}


@dataclass
class Art:
    """A stand-in for a KFP artifact: what the steps read and write."""

    path: str
    uri: str = ""
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        self.uri = self.uri or self.path


class FakeMetrics:
    """A stand-in for `Output[Metrics]`: records log_metric calls."""

    def __init__(self):
        self.logged: list[tuple[str, float]] = []
        self.metadata: dict = {}

    def log_metric(self, key, value):
        self.logged.append((key, value))
        self.metadata[key] = value


def _train_inputs(tmp_path: Path) -> dict:
    return {
        "base_model": Art(str(tmp_path / "model"), "gs://b/models/m", dict(MODEL_META)),
        "train_dataset": Art(str(tmp_path / "train"), "gs://b/run/train",
                             {"manifest_sha256": "t" * 64, "data_snapshot": "snap-1"}),
        "eval_dataset": Art(str(tmp_path / "eval"), "gs://b/run/eval", {"manifest_sha256": "e" * 64}),
        "adapter": Art(str(tmp_path / "adapter")),
    }  # fmt: skip


LOG = [
    {"loss": 2.0, "step": 1, "global_step/max_steps": "1/2"},
    {"loss": 1.0, "step": 2, "global_step/max_steps": "2/2"},
]
METRICS = {"train_loss": 1.5, "eval_loss": 1.25, "steps": 2, "wall_s": 3.0}


class FakeTrain:
    """The core's train_lora replaced: records each call's keyword arguments; `is_chief` says which node it is."""

    def __init__(self):
        self.calls: list[dict] = []
        self.is_chief = True

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if kwargs["swift_args"].get("refuse"):
            raise TrainError("swift.max_length must be > 0, got -1")
        return TrainResult(
            adapter_dir=kwargs["adapter_out"], checkpoint="/work/ckpt/v0/checkpoint-2", metrics=dict(METRICS),
            log_history=LOG, is_chief=self.is_chief, resumed_from="checkpoint-1", strategy="ddp",
            manifest_sha256="m" * 64,
        )  # fmt: skip


@pytest.fixture
def fake_train(monkeypatch) -> FakeTrain:
    fake = FakeTrain()
    monkeypatch.setattr(train_step_mod, "train_lora", fake)
    return fake


@pytest.fixture
def attached(monkeypatch):
    """Records what train-lora attaches to MLflow and W&B: (tracker, settings, adapter, {name: file text})."""
    seen: list[tuple] = []

    def recorder(tracker):
        def attach(settings, adapter_out, files, task):
            assert task == "train-lora"
            seen.append((tracker, settings, adapter_out, {k: Path(v).read_text() for k, v in files.items()}))
            return ""

        return attach

    monkeypatch.setattr(tracking, "attach_files", recorder("mlflow"))
    monkeypatch.setattr(wandb_tracking, "attach_files", recorder("wandb"))
    return seen


def test_train_step_calls_the_core_with_the_artifacts_and_returns_its_outputs(tmp_path, fake_train, attached):
    arts = _train_inputs(tmp_path)
    swift = {"num_train_epochs": 1}
    env = {tracking.ENV_URI: "http://mlflow:5000", "NCCL_DEBUG": "WARN"}
    settings = {"checkpoint_root": "gs://b/ckpt", "accelerator_count": 8, "preflight": "warn", "job_env": env}
    out = train_step_mod.train_step(**arts, swift_args=swift, settings=settings)
    (call,) = fake_train.calls
    key = durable_checkpoint_dir("gs://b/ckpt", "gs://b/models/m", "gs://b/run/train", "gs://b/run/eval", swift)
    assert key.startswith("gs://b/ckpt/") and key.endswith("/train-lora")
    assert call["checkpoint_dir"] == key and call["expected_gpus"] == 8 and call["ddp_timeout_s"] is None
    assert call["model_dir"] == arts["base_model"].path and call["model_type"] == "qwen3_vl"
    assert (call["train_dir"], call["eval_dir"], call["adapter_out"]) == (
        arts["train_dataset"].path, arts["eval_dataset"].path, arts["adapter"].path)  # fmt: skip
    assert call["base_model_ref"] == {**MODEL_META, "uri": "gs://b/models/m"}
    assert call["preflight"] == "warn" and call["job_env"] == env and call["swift_args"] == swift
    assert call["dataset_markers"] == {arts["train_dataset"].path: "t" * 64, arts["eval_dataset"].path: "e" * 64}
    assert Path(call["work_dir"]).is_dir()
    assert out.metrics == METRICS
    meta = out.metadata["adapter"]
    assert list(meta) == ["base_model", "source", "revision", "architecture", "model_type", "checkpoint", "strategy",
                          "resumed_from", "data_snapshot", "manifest_sha256"]  # fmt: skip
    assert meta == {"base_model": "gs://b/models/m", **MODEL_META, "checkpoint": "checkpoint-2", "strategy": "ddp",
                    "resumed_from": "checkpoint-1", "data_snapshot": "snap-1", "manifest_sha256": "m" * 64}  # fmt: skip
    curve = Path(out.files["loss_curve"]).read_text()
    assert curve.lstrip().lower().startswith("<!doctype html") and "<svg" in curve
    # the report as the task shows it goes to both trackers, under one name, from the settings in job_env
    assert [a[0] for a in attached] == ["mlflow", "wandb"]
    assert attached[0][1]["mlflow_uri"] == "http://mlflow:5000" and attached[1][1] == {"wandb": {}}
    assert all(a[2] == arts["adapter"].path and a[3] == {"train-lora/loss_curve.html": curve} for a in attached)


def test_train_step_keeps_a_given_checkpoint_dir_and_ddp_timeout(tmp_path, fake_train, attached):
    # a given folder wins over the root's; numbers arrive as KFP passes them (doubles)
    given = {"checkpoint_dir": "/gcs/b/ck", "ddp_timeout_s": 600.0, "checkpoint_root": "gs://b/ckpt"}
    train_step_mod.train_step(**_train_inputs(tmp_path), swift_args={}, settings=given)
    train_step_mod.train_step(**_train_inputs(tmp_path), swift_args={}, settings={})  # no root: no durable checkpoints
    assert [c["checkpoint_dir"] for c in fake_train.calls] == ["/gcs/b/ck", None]
    assert [c["ddp_timeout_s"] for c in fake_train.calls] == [600, None]


def test_train_step_turns_a_refused_run_and_an_unreachable_tracker_into_one_line_exits(
    tmp_path, fake_train, monkeypatch
):
    with pytest.raises(SystemExit, match=r"^train-lora: swift.max_length must be > 0, got -1$"):
        train_step_mod.train_step(**_train_inputs(tmp_path), swift_args={"refuse": True}, settings={})

    def unreachable(*_):
        raise tracking.TrackingError("MLflow at http://mlflow:5000 cannot be reached; start it or set ...=0")

    monkeypatch.setattr(tracking, "attach_files", unreachable)
    with pytest.raises(SystemExit, match=r"^train-lora: MLflow at http://mlflow:5000 cannot be reached"):
        train_step_mod.train_step(**_train_inputs(tmp_path), swift_args={}, settings={})


def _kfp_train_args(tmp_path: Path) -> dict:
    (tmp_path / "out").mkdir(parents=True)
    return dict(
        base_model=dsl.Model(uri=str(tmp_path / "model"), metadata=dict(MODEL_META)),
        train_dataset=dsl.Dataset(uri=str(tmp_path / "train"), metadata={"data_snapshot": "snap-1"}),
        eval_dataset=dsl.Dataset(uri=str(tmp_path / "eval")),
        swift_args={},
        settings={},
        adapter=dsl.Model(uri=str(tmp_path / "out" / "adapter")),
        metrics=dsl.Metrics(uri=str(tmp_path / "out" / "metrics")),
        loss_curve=dsl.HTML(uri=str(tmp_path / "out" / "loss_curve")),
    )


def test_the_train_lora_component_writes_the_metrics_the_curve_and_the_adapter_metadata(tmp_path, fake_train, attached):
    from components.train_lora.component import train_lora

    args = _kfp_train_args(tmp_path)
    assert train_lora.python_func(**args) is None
    assert args["metrics"].metadata == METRICS
    assert (
        args["adapter"].metadata["checkpoint"] == "checkpoint-2"
        and args["adapter"].metadata["data_snapshot"] == "snap-1"
    )
    html = Path(args["loss_curve"].path).read_text()
    assert "<svg" in html and html == attached[0][3]["train-lora/loss_curve.html"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["loss_curve"]  # no staging file left


def test_a_worker_node_exits_0_and_writes_no_outputs(tmp_path, fake_train, attached, capsys):
    from components.train_lora.component import train_lora

    fake_train.is_chief = False
    args = _kfp_train_args(tmp_path)
    with pytest.raises(SystemExit) as info:
        train_lora.python_func(**args)
    assert info.value.code == 0
    assert "train-lora: worker node done; the chief writes the outputs" in capsys.readouterr().out
    assert args["metrics"].metadata == {} and args["adapter"].metadata == {} and attached == []
    assert not Path(args["loss_curve"].path).exists()


def _jobset_template() -> dict:
    """The template the two-node GKE config compiles into the pipeline."""
    from pipelines import gke
    from pipelines.config import load_config

    return gke.jobset_template(load_config("configs/qwen3_vl_4b/lora_h100_x8_2node.yaml"), "registry/train:tag")


def test_the_jobset_step_names_the_jobset_by_its_inputs_and_writes_the_chiefs_record(tmp_path, monkeypatch):
    from components.train_lora.component import train_lora_jobset

    followed: list[dict] = []
    monkeypatch.setattr(train_step_mod, "in_cluster_client", lambda: "client")
    monkeypatch.setattr(train_step_mod, "follow_jobset", lambda client, manifest: followed.append(manifest))
    args = _kfp_train_args(tmp_path)
    args["base_model"].uri = "gs://b/models/m"
    record = {"metrics": METRICS, "checkpoint": "checkpoint-2", "strategy": "zero2", "resumed_from": ""}
    result = Path(args["adapter"].uri + ".run.json")
    result.write_text(json.dumps(record))
    Path(str(result) + ".html").write_bytes(b"<html>curve \xc3\xa9</html>")
    template = _jobset_template()
    args["settings"] = {"checkpoint_root": "gs://b/ckpt", "accelerator_count": 8}
    train_lora_jobset.python_func(**args, jobset=template)
    inputs = ("gs://b/models/m", args["train_dataset"].uri, args["eval_dataset"].uri, {})
    (manifest,) = followed
    assert manifest["metadata"]["name"] == "vlm-lora-" + durable_checkpoint_dir("k", *inputs).split("/")[1]
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    cmd = pod["containers"][0]["args"]
    assert cmd[cmd.index("--checkpoint-dir") + 1] == durable_checkpoint_dir("gs://b/ckpt", *inputs).replace(
        "gs://", "/gcs/"
    )
    assert args["metrics"].metadata == METRICS
    assert args["adapter"].metadata == {"base_model": "gs://b/models/m", "checkpoint": "checkpoint-2",
                                        "strategy": "zero2", "resumed_from": ""}  # fmt: skip
    assert Path(args["loss_curve"].path).read_bytes() == b"<html>curve \xc3\xa9</html>"  # copied byte for byte

    def failed(*_):
        raise JobSetFailed("JobSet vlm-lora-x Failed: pod 1: CUDA error")

    monkeypatch.setattr(train_step_mod, "follow_jobset", failed)
    with pytest.raises(SystemExit, match=r"^train-lora: JobSet vlm-lora-x Failed: pod 1: CUDA error$"):
        train_lora_jobset.python_func(**_kfp_train_args(tmp_path / "again"), jobset=template)


def test_the_stage_model_component_points_the_artifact_at_the_entry_with_progress_on(tmp_path, capsys, monkeypatch):
    import components.stage_model.step as stage_step_mod
    from components.stage_model.component import stage_model
    from components.stage_model.core import result_summary

    staged = []

    def stage(*args, **kwargs):  # the real core, its result kept
        staged.append((args, kwargs, real(*args, **kwargs)))
        return staged[-1][2]

    real = stage_step_mod.stage_model
    monkeypatch.setattr(stage_step_mod, "stage_model", stage)
    src = make_model(tmp_path / "src" / "tiny")
    model = dsl.Model(uri=str(tmp_path / "artifact"))
    stage_model.python_func(source=str(src), cache=str(tmp_path / "cache"), revision="", token_from="",
                            allow=["*.json", "*.safetensors"], ignore=[], model=model)  # fmt: skip
    ((args, kwargs, result),) = staged
    assert args == (str(src), str(tmp_path / "cache"), ["*.json", "*.safetensors"], None)
    assert kwargs == {"revision": None, "token_from": None, "progress": True}
    captured = capsys.readouterr()
    assert "stage-model: checksums of" in captured.err and "(100 %)" in captured.err  # progress lines in the log
    assert model.uri == result.entry and Path(result.entry, "config.json").is_file()
    assert model.metadata == result_summary(result) and model.metadata["model_type"] and not model.metadata["cache_hit"]
    assert f"stage-model: staged {result.entry} ({result.bytes_copied} bytes copied)" in captured.out
    with pytest.raises(SystemExit, match=r"^stage-model: .*no-such-folder"):
        stage_model.python_func(source=str(tmp_path / "no-such-folder"), cache=str(tmp_path / "cache"), revision="",
                                token_from="", allow=[], ignore=[], model=dsl.Model(uri=str(tmp_path / "b")))  # fmt: skip


@dataclass
class _Merged:
    metadata: dict


def test_the_merge_export_step_adds_the_lineage_to_the_cores_metadata(tmp_path, monkeypatch):
    from components.merge_export.component import merge_export

    calls: list[tuple] = []

    def merge(adapter_dir, model_dir, out_dir, work_dir, *, adapter_marker):
        calls.append((adapter_dir, model_dir, out_dir, Path(work_dir).is_dir(), adapter_marker))
        if adapter_marker == "wrong":
            raise AdapterBaseMismatch("adapter_config.json: base_model_name_or_path is Qwen3-VL-8B, staged is 4B")
        return _Merged({"logits_max_abs_diff": 0.001, "model_type": "from-core", "card": "README.md"})

    monkeypatch.setattr(merge_step_mod, "merge_export", merge)
    base = dsl.Model(uri=str(tmp_path / "model"), metadata={"model_type": "qwen3_vl"})
    adapter = dsl.Model(uri=str(tmp_path / "adapter"), metadata={"manifest_sha256": "a" * 64})
    merged = dsl.Model(uri=str(tmp_path / "merged"))
    assert merge_export.python_func(base_model=base, adapter=adapter, merged_model=merged) is None
    assert calls == [(adapter.path, base.path, merged.path, True, "a" * 64)]
    assert merged.metadata == {"logits_max_abs_diff": 0.001, "model_type": "qwen3_vl", "card": "README.md",
                               "base_model": base.uri, "adapter": adapter.uri}  # fmt: skip
    bad = Art(str(tmp_path / "adapter"), metadata={"manifest_sha256": "wrong"})
    with pytest.raises(SystemExit, match=r"^merge-export: AdapterBaseMismatch: adapter_config.json: base_model_name"):
        merge_step_mod.merge_step(Art(str(tmp_path / "model")), bad, Art(str(tmp_path / "m2")))


def test_the_steps_outputs_go_through_the_one_helper(tmp_path, fake_train, attached):
    """train_step's outputs on plain stand-ins: the helper logs the numbers and copies the curve whole."""
    arts = _train_inputs(tmp_path)
    metrics, curve = FakeMetrics(), Art(str(tmp_path / "curve.html"))
    out = train_step_mod.train_step(**arts, swift_args={}, settings={})
    write_outputs(out, metrics, adapter=arts["adapter"], loss_curve=curve)
    assert metrics.logged == list(METRICS.items())
    assert Path(curve.path).read_text() == Path(out.files["loss_curve"]).read_text()
    assert arts["adapter"].metadata["strategy"] == "ddp"
