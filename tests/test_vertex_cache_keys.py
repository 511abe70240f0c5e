"""Vertex's cache keys, task by task (#13, "Must show 1"): an unchanged scheduled run is a cache hit end to end.

Vertex reuses a task's earlier execution when its cache key is unchanged: the task's
resolved input parameter values, the IDs of its input artifacts, and its component spec
(the executor's image, command and arguments, and the defaults of inputs the task leaves
unset). So, from one scheduled run to the next:

* a constant is the same, unless it holds a per-run placeholder (`{{$.pipeline_job_uuid}}`,
  `{{$.pipeline_job_name}}`, `{{$.pipeline_task_uuid}}`, the job's create / schedule time...);
* a pipeline parameter is the same (a schedule passes the same values every run);
* another task's output parameter is a value: the same when its producer's value is. The
  never-cached snapshot-data and find-champion compute theirs from content (the data
  listing and settings; the registry's champion), so the same data gives the same value:
  shown below for validate-data's `snapshot` with local files and a Cloud Storage listing;
* another task's output artifact is a new artifact (a new ID) whenever its producer runs:
  the same only when the producer is a cache hit itself (cacheable, with a stable key).
  An artifact of a never-cached task is new every run.

`cache_keys` applies these rules to a compiled spec. The tests apply it to the seed config
(with a champion: the tasks sit in the `new-data-or-settings` branch) and to one without
(tasks at the root), and to a deliberately broken pipeline, to show the check catches a
per-run value and an artifact of an uncached task.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, dsl

from components.common import snapshot as snap
from components.snapshot_data.core import resolve_sources, snapshot_data
from pipelines.compile import compile_pipeline
from pipelines.config import load_config
from pipelines.pipeline import CHAMPION_TASK, SNAPSHOT_TASK, pipeline_arguments
from tests.pipeline_spec import Source, as_dict, inputs, source, tasks

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "configs" / "qwen3_vl_4b" / "lora_seed.yaml"
# The tasks that must be cache hits when the data and settings did not change.
TRAINING = ("stage-model", "validate-data", "train-lora", "merge-export", "evaluate")
# Per-run placeholders: the job's id, name, resource name, create / schedule time; the task's id and name.
PER_RUN = re.compile(r"\{\{\$\.pipeline_(?:job|task)_\w+\}\}")
# Never-cached tasks whose output parameters are computed from content, not from the run.
CONTENT_VALUES = {
    SNAPSHOT_TASK: "from the data listing, the model's commit, the settings: same content, same value",
    CHAMPION_TASK: "looked up each run: the same until a new champion is registered",
}
ROW = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}\n'


# ---------------------------------------------------------------- the cache key model


@dataclass(frozen=True)
class KeyPart:
    """One part of a task's cache key and whether it is the same next run.

    Attributes:
        task: The task's key in the spec.
        part: "caching", "parameter NAME", "artifact NAME", "defaults" or "executor".
        origin: Where the value comes from (a constant, a pipeline parameter, TASK.OUTPUT, an image).
        stable: Whether an unchanged run gives the same value.
        why: The reason, in words.
    """

    task: str
    part: str
    origin: str
    stable: bool
    why: str


def cache_keys(spec: Any, watched: tuple[str, ...], content_values: dict[str, str]) -> list[KeyPart]:
    """Returns the parts of the watched tasks' cache keys, each judged stable or not (rules: module docstring).

    Args:
        spec: The compiled pipeline (dict of the YAML).
        watched: The tasks to report, by key; their producers are judged as needed.
        content_values: Never-cached tasks whose output parameters depend only on content,
            with the reason (e.g. `CONTENT_VALUES`).

    Returns:
        The KeyParts of the watched tasks, task by task in `watched` order.
    """
    raw = as_dict(spec)
    index = tasks(raw)
    memo: dict[str, list[KeyPart]] = {}

    def stable(name: str) -> bool:
        return all(p.stable for p in key_of(name))

    def from_input(name: str, key: str, src: Source) -> KeyPart:
        if src.kind == "constant":
            hit = PER_RUN.search(json.dumps(src.value))
            shown = json.dumps(src.value)
            shown = shown if len(shown) <= 48 else shown[:45] + "..."
            return KeyPart(name, f"parameter {key}", f"constant {shown}", not hit, hit.group(0) if hit else "constant")
        if src.kind == "pipeline parameter":
            return KeyPart(name, f"parameter {key}", str(src), True, "the schedule's value, the same every run")
        producer = index[src.producer]
        if src.kind == "task output parameter":
            if not producer.caches and src.producer in content_values:
                return KeyPart(name, f"parameter {key}", str(src), True, content_values[src.producer])
            if not producer.caches:
                return KeyPart(name, f"parameter {key}", str(src), False, "value of a never-cached task, made per run")
            ok = stable(src.producer)
            why = "value of a cache hit" if ok else f"{src.producer} reruns: its key changes every run"
            return KeyPart(name, f"parameter {key}", str(src), ok, why)
        if not producer.caches:
            why = f"artifact of never-cached {src.producer}: a new artifact ID every run"
            return KeyPart(name, f"artifact {key}", str(src), False, why)
        ok = stable(src.producer)
        why = "artifact of a cache hit: the same ID" if ok else f"{src.producer} reruns: a new artifact ID every run"
        return KeyPart(name, f"artifact {key}", str(src), ok, why)

    def key_of(name: str) -> list[KeyPart]:
        if name in memo:
            return memo[name]
        memo[name] = []  # a cycle would read as stable; KFP DAGs have none
        t = index[name]
        parts = [KeyPart(name, "caching", "enableCache", t.caches, "cacheable" if t.caches else "never cached")]
        parts += [from_input(name, key, src) for key, src in sorted(inputs(index, name).items())]
        bound = t.spec.get("inputs", {}).get("parameters", {})
        defaults = {
            k: d["defaultValue"]
            for k, d in t.component.get("inputDefinitions", {}).get("parameters", {}).items()
            if k not in bound and "defaultValue" in d
        }
        per_run = sorted(k for k, v in defaults.items() if PER_RUN.search(json.dumps(v)))
        why = f"per-run placeholder in {', '.join(per_run)}" if per_run else "no per-run placeholder"
        parts.append(KeyPart(name, "defaults", f"{len(defaults)} unset inputs", not per_run, why))
        executor = raw["deploymentSpec"]["executors"][t.component["executorLabel"]]["container"]
        hit = PER_RUN.search(json.dumps(executor))
        why = f"{hit.group(0)} in the container spec" if hit else "image, command, args: no per-run placeholder"
        parts.append(KeyPart(name, "executor", executor["image"].rsplit("/", 1)[-1], not hit, why))
        memo[name] = parts
        return parts

    return [part for name in watched for part in key_of(name)]


def table(parts: list[KeyPart]) -> str:
    """Returns the key parts as a text table, task by task, with a verdict per task."""
    lines = [f"{'task':14} {'key part':30} {'from':54} same next run?"]
    for name in dict.fromkeys(p.task for p in parts):
        rows = [p for p in parts if p.task == name]
        for p in rows:
            lines.append(f"{p.task:14} {p.part:30} {p.origin:54} {'yes' if p.stable else 'NO'}: {p.why}")
        verdict = "cache hit" if all(p.stable for p in rows) else "RERUNS EVERY RUN"
        lines.append(f"{name:14} => {verdict}")
    return "\n".join(lines)


def key_values(index: dict, task: str, arguments: dict[str, Any], outputs: dict[str, dict[str, Any]]) -> dict:
    """Returns a task's cache-key inputs as values, given the run's arguments and the producers' outputs.

    Args:
        index: `tasks(spec)`.
        task: The task's key.
        arguments: The pipeline parameters' values.
        outputs: {producer: {output key: value}} of the tasks it reads values from.

    Returns:
        {input: value}; an input artifact as "artifact of PRODUCER.KEY" (its ID is the same
        when that producer is a cache hit).
    """
    values: dict[str, Any] = {}
    for key, src in inputs(index, task).items():
        if src.kind == "constant":
            values[key] = src.value
        elif src.kind == "pipeline parameter":
            values[key] = arguments[src.value]
        elif src.kind == "task output parameter":
            values[key] = outputs[src.producer][src.key]
        else:
            values[key] = f"artifact of {src}"
    return values


# ---------------------------------------------------------------- the pipeline's keys


def _variant(tmp: Path, champion: bool) -> Path:
    if champion:
        return SEED  # eval.reference auto + a registry model: the champion
    raw = yaml.safe_load(SEED.read_text())
    raw["eval"]["reference"] = "base"
    path = tmp / "base.yaml"
    path.write_text(
        "# test config: the seed, compared with the base model (no champion look-up)\n" + yaml.safe_dump(raw)
    )
    return path


@pytest.fixture(scope="module", params=[True, False], ids=["champion", "no-champion"])
def compiled(request, tmp_path_factory) -> tuple[dict, Path, bool]:
    """(the compiled Vertex spec, its config, whether it has a champion)."""
    tmp = tmp_path_factory.mktemp("keys")
    config = _variant(tmp, request.param)
    out = compile_pipeline(str(config), str(tmp / "p.yaml"), target="vertex")
    return yaml.safe_load(out.read_text()), config, request.param


def test_snapshot_data_is_never_cached_and_validate_data_takes_its_snapshot(compiled):
    raw, _, champion = compiled
    index = tasks(raw)
    assert not index[SNAPSHOT_TASK].caches and index[SNAPSHOT_TASK].groups == ()
    assert source(index, "validate-data", "snapshot") == Source(
        "task output parameter", producer=SNAPSHOT_TASK, key="snapshot"
    )
    assert "train_data" not in inputs(index, "validate-data")  # no raw source names: the snapshot instead
    branch = ("new-data-or-settings",) if champion else ()
    assert all(index[name].group_names[-1:] == branch for name in TRAINING)


def test_an_unchanged_run_is_a_cache_hit_from_stage_model_to_evaluate(compiled):
    raw, _, _ = compiled
    parts = cache_keys(raw, TRAINING, CONTENT_VALUES)
    report = table(parts)
    print(report)  # shown with pytest -rP
    assert {p.task for p in parts} == set(TRAINING)
    assert [p for p in parts if not p.stable] == [], "a task's cache key changes every run:\n" + report
    # the rule the table applies, spelled out: no artifact of a never-cached task reaches them
    index = tasks(raw)
    for name in TRAINING:
        for key, src in inputs(index, name).items():
            if src.kind == "task output artifact":
                assert src.producer not in (SNAPSHOT_TASK, CHAMPION_TASK), (name, key, src)
            assert not PER_RUN.search(json.dumps(src.value)), (name, key, src)


# ---------------------------------------------------------------- the check catches a broken pipeline


@dsl.component(base_image="python:3.11-slim")
def _files(files: dsl.Output[dsl.Dataset]) -> str:
    return "x"


@dsl.component(base_image="python:3.11-slim")
def _use(data: dsl.Input[dsl.Dataset], note: str, out: dsl.Output[dsl.Dataset]):
    pass


@dsl.component(base_image="python:3.11-slim")
def _stamped(data: dsl.Input[dsl.Dataset], out: dsl.Output[dsl.Dataset], run: str = "{{$.pipeline_job_name}}"):
    pass


@dsl.pipeline(name="broken-keys")
def _broken(note: str = "n"):
    listing = _files().set_caching_options(False).set_display_name("listing")  # never cached
    staged = _files().set_display_name("staged")
    ok = _use(data=staged.outputs["files"], note=note).set_display_name("ok")
    with dsl.If(listing.outputs["Output"] == "x", name="branch"):
        _use(data=staged.outputs["files"], note=dsl.PIPELINE_JOB_ID_PLACEHOLDER).set_display_name("job-id")
        fresh = _use(data=listing.outputs["files"], note=note).set_display_name("uncached-artifact")
        _use(data=fresh.outputs["out"], note=note).set_display_name("downstream")
        _use(data=ok.outputs["out"], note=listing.outputs["Output"]).set_display_name("value")
        _stamped(data=ok.outputs["out"]).set_display_name("default")


def test_the_check_fails_on_per_run_values_and_uncached_artifacts(tmp_path):
    out = tmp_path / "broken.yaml"
    compiler.Compiler().compile(_broken, str(out))
    raw = yaml.safe_load(out.read_text())
    index = tasks(raw)
    by_display = {t.display_name: name for name, t in index.items() if not t.is_group}
    watched = tuple(by_display[d] for d in ("ok", "job-id", "uncached-artifact", "downstream", "value", "default"))

    def verdicts(content_values: dict[str, str]) -> dict[str, bool]:
        parts = cache_keys(raw, watched, content_values)
        return {
            d: all(p.stable for p in parts if p.task == by_display[d]) for d in by_display if by_display[d] in watched
        }

    assert verdicts({}) == {
        "ok": True,
        "job-id": False,  # {{$.pipeline_job_uuid}} as a parameter
        "uncached-artifact": False,  # an artifact of a never-cached task
        "downstream": False,  # ... and everything after it
        "value": False,  # a value of a never-cached task not known to be content-derived
        "default": False,  # a per-run placeholder in an unset input's default
    }
    assert verdicts({by_display["listing"]: "content-derived"})["value"] is True  # as snapshot-data's snapshot
    parts = cache_keys(raw, watched, {})
    [defaults] = [p for p in parts if p.task == by_display["default"] and p.part == "defaults"]
    assert not defaults.stable and defaults.why == "per-run placeholder in run"  # caught in the defaults themselves
    report = table(parts)
    assert "{{$.pipeline_job_uuid}}" in report and "a new artifact ID every run" in report


# ---------------------------------------------------------------- listings: the snapshot is validate-data's key


def _settings() -> dict[str, Any]:
    # what the component passes as `training`; a gs:// model is not pinned (no hub call)
    return {"model_source": "gs://test-bucket/models/qwen3-vl-4b", "model_revision": "", "swift_args": {"lora_rank": 8}}


def _validate_data_key(raw: dict, cfg_path: Path, train: str) -> dict[str, Any]:
    """validate-data's cache-key inputs for a run whose snapshot-data resolved `train` now."""
    result = snapshot_data(train=train, training=_settings())
    assert result.snapshot_json == snap.canonical(resolve_sources(train).snapshot)  # the output is the listing
    outputs = {
        SNAPSHOT_TASK: {
            "snapshot": result.snapshot_json,
            "training_key": result.training_key,
            "fingerprint": result.fingerprint,
            "up_to_date": result.up_to_date,
            "model_source": result.model_source,
            "model_revision": result.model_revision,
        },
        CHAMPION_TASK: {"uri": "gs://test-bucket/models/champion", "version_id": "3"},
    }
    arguments = {**pipeline_arguments(load_config(cfg_path)), "data_train": train}
    return key_values(tasks(raw), "validate-data", arguments, outputs)


def test_local_files_identical_give_the_same_validate_data_inputs_and_a_change_other_ones(compiled, tmp_path):
    raw, cfg_path, _ = compiled
    shard = tmp_path / "d" / "2026-01" / "part-0.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(ROW)
    (tmp_path / "d" / "2026-02").mkdir()
    (tmp_path / "d" / "2026-02" / "part-0.jsonl").write_bytes(ROW)
    source_ = f"{tmp_path}/d/"
    first = _validate_data_key(raw, cfg_path, source_)
    assert _validate_data_key(raw, cfg_path, source_) == first
    shard.write_bytes(ROW + ROW)  # new rows in one file
    changed = _validate_data_key(raw, cfg_path, source_)
    assert {k for k in first if first[k] != changed[k]} == {"snapshot", "training_key"}


@pytest.mark.parametrize("pattern", ["drawings/", "drawings/2026-*/part-*.jsonl"], ids=["prefix", "glob"])
def test_a_new_generation_of_one_object_gives_other_validate_data_inputs(compiled, gcs_client, gcs_bucket, pattern):
    raw, cfg_path, _ = compiled
    bucket = gcs_client.bucket(gcs_bucket)
    for name in ("drawings/2026-01/part-0.jsonl", "drawings/2026-02/part-0.jsonl"):
        bucket.blob(name).upload_from_string(ROW)
    bucket.blob("drawings/2026-01/images/a.png").upload_from_string(b"png")
    train = f"gs://{gcs_bucket}/{pattern}"

    first = _validate_data_key(raw, cfg_path, train)
    assert _validate_data_key(raw, cfg_path, train) == first  # re-listing, nothing changed: a cache hit

    before = bucket.get_blob("drawings/2026-02/part-0.jsonl").generation
    bucket.blob("drawings/2026-02/part-0.jsonl").upload_from_string(ROW)  # same bytes, new generation
    assert bucket.get_blob("drawings/2026-02/part-0.jsonl").generation != before
    second = _validate_data_key(raw, cfg_path, train)
    assert {k for k in first if first[k] != second[k]} == {"snapshot", "training_key"}
    change = snap.diff(json.loads(first["snapshot"]), json.loads(second["snapshot"]))
    assert change.changed == [f"gs://{gcs_bucket}/drawings/2026-02/part-0.jsonl"] and change.unchanged == 1
    assert _validate_data_key(raw, cfg_path, train) == second
