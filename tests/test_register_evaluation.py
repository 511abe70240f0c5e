"""register's ModelEvaluation: the pure builder, then the real aiplatform client against the recording server.

Asserted: what evaluate's metrics become (the tuned figures as metrics; the reference, the gate,
the lineage and the report link as metadata; one slice per label and per regression kind, with
and without a regression set), that they follow the shipped schema, the recorded
ImportModelEvaluation and BatchImportModelEvaluationSlices requests field by field, and a refused
import: one WARNING line naming the version and the permission, the version still registered and
promoted, `evaluation_imported: false` in register's output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from kfp import dsl

from components.register.core import (
    EVALUATION_FILE,
    SLICE_BATCH,
    attach_evaluation,
    build_upload_request,
    import_evaluation,
    register_model,
)
from components.register.evaluation import SCHEMA_FILE, EvaluationRequest, build_evaluation, schema_path
from pipelines.vertex import init_vertex
from tests.test_vertex_submit import PARENT, api  # noqa: F401 (fixture)

CRED = AnonymousCredentials()
MODEL = f"{PARENT}/models/qwen-drawings"
SCHEMA_URI = "gs://test-bucket/root/run-7/register/registered_model/" + SCHEMA_FILE

# evaluate's Metrics metadata as it writes it today (no per-label figures, no regression set)
TODAY = {
    "tuned_n": 40.0,
    "tuned_f1": 0.8125,
    "tuned_precision": 0.9,
    "tuned_recall": 0.75,
    "tuned_json_valid_rate": 1.0,
    "tuned_exact_match_rate": 0.5,
    "tuned_tp": 30.0,
    "tuned_fp": 3.0,
    "tuned_fn": 10.0,
    "tuned_samples_per_second": 2.5,
    "base_n": 40.0,
    "base_f1": 0.5,
    "base_precision": 0.6,
    "base_recall": 0.4,
    "base_json_valid_rate": 0.95,
    "base_exact_match_rate": 0.25,
    "base_tp": 16.0,
    "base_fp": 11.0,
    "base_fn": 24.0,
    "base_samples_per_second": 2.0,
    "passed": 1.0,
    "reference_is_champion": 1.0,
    "reference_version": 3.0,
    "reference": "champion@3",
}
# the blocks evaluate adds: per-label figures and the regression set (with its flat copies)
REGRESSION = {
    "overall": {"reference": {"n": 12, "score": 0.7}, "tuned": {"n": 12, "score": 0.65}, "delta": {"score": -0.05}},
    "kinds": {
        "vqa": {
            "reference": {"n": 8, "score": 0.75, "anls": 0.8},
            "tuned": {"n": 8, "score": 0.625, "anls": 0.7},
            "delta": {"n": 0, "score": -0.125, "anls": -0.1},
        },
        "ocr": {
            "reference": {"n": 4, "score": 0.65, "cer": 0.35},
            "tuned": {"n": 4, "score": 0.675, "cer": 0.325},
            "delta": {"n": 0, "score": 0.025, "cer": -0.025},
        },
    },
}
LABELS = {
    "hole": {
        "reference": {"tp": 10, "fp": 5, "fn": 10, "n_gold": 20, "precision": 0.6667, "recall": 0.5, "f1": 0.5714},
        "tuned": {"tp": 18, "fp": 1, "fn": 2, "n_gold": 20, "precision": 0.9474, "recall": 0.9, "f1": 0.9231},
    },
    "slot": {
        "reference": {"tp": 6, "fp": 6, "fn": 14, "n_gold": 20, "precision": 0.5, "recall": 0.3, "f1": 0.375},
        "tuned": {"tp": 12, "fp": 2, "fn": 8, "n_gold": 20, "precision": 0.8571, "recall": 0.6, "f1": 0.7059},
    },
}
WITH_BLOCKS = {
    **TODAY,
    "labels": LABELS,
    "regression": REGRESSION,
    "tuned_regression_vqa_anls": 0.7,  # flat copies evaluate also logs: not task figures
    "base_regression_score": 0.7,
    "regression_vqa_drop": 0.125,
    "regression_max_drop": {"overall": 0.05, "vqa": 0.15, "ocr": 0.05},
    "gate_failed": [],
}
GATE = {"reason": "PASS: f1 0.8125 >= min_value 0.5000", "metric": "f1", "min_value": "0.5", "min_margin": 0.0}
LINEAGE = {
    "data_snapshot": "abc123",
    "training_key": "k9",
    "base_model": "gs://b/models/qwen",
    "adapter": "",
    "x": None,
}
TUNED = {
    "n": 40.0,
    "f1": 0.8125,
    "precision": 0.9,
    "recall": 0.75,
    "json_valid_rate": 1.0,
    "exact_match_rate": 0.5,
    "tp": 30.0,
    "fp": 3.0,
    "fn": 10.0,
}


# --- the pure builder ----------------------------------------------------------------------


def test_todays_metrics_become_the_tuned_figures_with_the_reference_gate_and_lineage_as_metadata():
    built = build_evaluation(TODAY, "run-7", SCHEMA_URI, GATE, LINEAGE, "gs://test-bucket/root/run-7/report.html")
    ev = built.evaluation
    assert ev["display_name"] == "run-7 vs champion@3"
    assert ev["metrics_schema_uri"] == SCHEMA_URI
    assert ev["metrics"] == TUNED  # the tuned model's task figures only: no speed, no reference
    meta = ev["metadata"]
    assert meta["pipeline_job_id"] == "run-7"
    assert meta["evaluation_report"] == "gs://test-bucket/root/run-7/report.html"
    ref = meta["reference"]
    assert (ref["name"], ref["is_champion"], ref["version"]) == ("champion@3", True, "3")
    assert ref["metrics"]["f1"] == 0.5 and ref["metrics"]["json_valid_rate"] == 0.95
    assert ref["delta"]["f1"] == pytest.approx(0.3125) and ref["delta"]["fn"] == -14.0
    assert meta["gate"] == {
        "passed": True,
        "reason": "PASS: f1 0.8125 >= min_value 0.5000",
        "rules": {"metric": "f1", "min_value": 0.5, "min_margin": 0.0},  # "0.5" read as a number
    }
    assert meta["lineage"] == {"data_snapshot": "abc123", "training_key": "k9", "base_model": "gs://b/models/qwen"}
    assert meta["speed"] == {"tuned": {"samples_per_second": 2.5}, "reference": {"samples_per_second": 2.0}}
    assert "regression" not in ev["metrics"] and "regression" not in meta
    assert meta["notes"] == ["evaluate's metrics carry no per-label figures (key 'labels'): no label slices"]
    assert built.slices == [] and ev["slice_dimensions"] == []


def test_labels_and_a_regression_set_make_one_slice_each():
    built = build_evaluation(WITH_BLOCKS, "run-7", SCHEMA_URI, GATE, LINEAGE)
    ev = built.evaluation
    assert {k: v for k, v in ev["metrics"].items() if k != "regression"} == TUNED  # flat copies not read
    assert ev["metrics"]["regression"] == {
        "overall": {"n": 12, "score": 0.65},
        "kinds": {"ocr": REGRESSION["kinds"]["ocr"]["tuned"], "vqa": REGRESSION["kinds"]["vqa"]["tuned"]},
    }
    assert ev["metadata"]["regression"]["overall"] == {"reference": {"n": 12, "score": 0.7}, "delta": {"score": -0.05}}
    assert ev["metadata"]["regression"]["kinds"]["vqa"] == {
        "reference": REGRESSION["kinds"]["vqa"]["reference"],
        "delta": REGRESSION["kinds"]["vqa"]["delta"],  # evaluate's own delta, as given
    }
    assert ev["metadata"]["gate"]["rules"]["regression_max_drop"] == {"overall": 0.05, "vqa": 0.15, "ocr": 0.05}
    assert ev["metadata"]["gate"]["failed"] == []
    assert "notes" not in ev["metadata"]
    assert ev["slice_dimensions"] == ["annotationSpec", "slice"]
    assert [(s["slice_"]["dimension"], s["slice_"]["value"]) for s in built.slices] == [
        ("annotationSpec", "hole"),
        ("annotationSpec", "slot"),
        ("slice", "ocr"),
        ("slice", "vqa"),
    ]
    hole = built.slices[0]
    assert hole["metrics_schema_uri"] == SCHEMA_URI
    assert hole["metrics"]["f1"] == 0.9231 and hole["metrics"]["n_gold"] == 20
    assert hole["metrics"]["reference"] == LABELS["hole"]["reference"]
    assert hole["metrics"]["delta"]["f1"] == pytest.approx(0.9231 - 0.5714)  # computed: labels carry no delta
    assert hole["metrics"]["delta"]["tp"] == 8
    vqa = built.slices[3]
    assert vqa["slice_"]["slice_spec"] == {"configs": {"regression_kind": {"value": {"string_value": "vqa"}}}}
    assert vqa["metrics"] == {
        **REGRESSION["kinds"]["vqa"]["tuned"],
        "reference": REGRESSION["kinds"]["vqa"]["reference"],
        "delta": REGRESSION["kinds"]["vqa"]["delta"],
    }


def test_odd_values_are_left_out_and_named_never_raised():
    metrics = {
        **TODAY,
        "tuned_f1": float("nan"),
        "tuned_recall": "0.7",
        "base_precision": None,
        "labels": ["hole"],
        "regression": {"overall": {"tuned": {"score": float("inf")}, "reference": {"score": 0.5}}, "kinds": [1]},
        "passed": True,
    }
    built = build_evaluation(metrics, "run-7", SCHEMA_URI)
    ev = built.evaluation
    assert "f1" not in ev["metrics"] and "recall" not in ev["metrics"] and ev["metrics"]["precision"] == 0.9
    assert ev["metrics"]["regression"] == {"overall": {}, "kinds": {}}
    notes = ev["metadata"]["notes"]
    for part in ("tuned.f1 = nan", "tuned.recall = '0.7'", "base.precision = None", "labels is not an object"):
        assert any(part in note for note in notes), (part, notes)
    assert any("regression.overall.tuned.score = inf" in n for n in notes)
    assert any("regression.kinds is not an object" in n for n in notes)
    assert built.slices == []
    assert ev["metadata"]["gate"] == {"passed": True, "reason": "", "rules": {}}
    assert len(build_evaluation(TODAY, "r" * 200, SCHEMA_URI).evaluation["display_name"]) == 128


def _check(value, schema: dict, where: str = "metrics") -> None:
    """The OpenAPI Schema Object subset the shipped schema uses: type, properties, additionalProperties."""
    kind = schema.get("type")
    if kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), where
        return
    if kind == "object":
        assert isinstance(value, dict), where
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            assert isinstance(sub, dict), f"{where}.{key} is not in the schema"
            _check(item, sub, f"{where}.{key}")


def test_every_figure_follows_the_shipped_schema():
    schema = yaml.safe_load(schema_path().read_text())
    assert schema["type"] == "object" and schema["title"] == "VlmLoraEvaluationMetrics"
    for metrics in (TODAY, WITH_BLOCKS):
        built = build_evaluation(metrics, "run-7", SCHEMA_URI, GATE, LINEAGE)
        _check(built.evaluation["metrics"], schema)
        for one in built.slices:
            _check(one["metrics"], schema, f"slice {one['slice_']['value']}")
    with pytest.raises(AssertionError):  # the check itself bites
        _check({"f1": "high"}, schema)


def test_the_version_description_keeps_scalars_only():
    """The nested blocks go to the evaluation; cut at 2048 characters they would leave broken JSON."""
    req = build_upload_request("gs://b/m", "m", "", "img:1", "run-7", WITH_BLOCKS)
    described = json.loads(req["version_description"])
    assert described["metrics"]["tuned_f1"] == 0.8125 and described["metrics"]["reference"] == "champion@3"
    assert not {"labels", "regression", "regression_max_drop", "gate_failed"} & set(described["metrics"])


# --- against the recording server ----------------------------------------------------------


def _register(tmp_path: Path, run: str, metrics: dict, **kwargs) -> dsl.Artifact:
    from components.register import register

    merged = dsl.Model(
        uri=f"gs://test-bucket/root/{run}/merged",
        metadata={"data_snapshot": "abc123", "training_key": "k9", "base_model": "gs://b/base", "adapter": "gs://b/ad"},
    )
    eval_metrics = dsl.Metrics(uri=str(tmp_path / f"{run}-metrics"))
    eval_metrics.metadata.update(metrics)
    out = dsl.Artifact(uri=str(tmp_path / f"{run}-reg"))
    register.python_func(
        merged_model=merged,
        eval_metrics=eval_metrics,
        model_id="qwen-drawings",
        display_name="qwen-drawings",
        serving_image="img:1",
        alias="champion",
        labels={},
        run_name=run,
        serving_container={},
        registered_model=out,
        project="test-project",
        location="us-central1",
        **kwargs,
    )
    return out


def test_register_imports_the_evaluation_and_its_slices_field_by_field(api, tmp_path):
    from google.cloud import aiplatform

    from components.register import register

    assert register.component_spec.inputs["eval_report"].optional  # the pipeline may leave it out
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    report = dsl.HTML(uri="gs://test-bucket/root/run-7/evaluate/report")
    rules = {"metric": "f1", "min_value": 0.5, "min_margin": 0.0, "quantization": "none"}  # eval_settings (part)
    gate = dict(gate_reason="PASS: f1 0.8125 >= min_value 0.5000", gate_rules=rules)
    out = _register(tmp_path, "run-7", WITH_BLOCKS, eval_report=report, **gate)

    [upload] = api.calls("POST", "models:upload")
    [imported] = api.calls("POST", "evaluations:import")
    assert api.requests.index(upload) < api.requests.index(imported)  # the version exists first
    assert imported.path.replace("%40", "@") == f"/v1/{MODEL}@1/evaluations:import"  # the version, not the model
    ev = imported.body["modelEvaluation"]
    schema_file = tmp_path / "run-7-reg" / SCHEMA_FILE
    assert ev["displayName"] == "run-7 vs champion@3"
    assert ev["metricsSchemaUri"] == str(schema_file)
    assert schema_file.read_bytes() == schema_path().read_bytes()  # the schema it names is there
    assert {k: v for k, v in ev["metrics"].items() if k != "regression"} == TUNED
    assert ev["metrics"]["regression"]["overall"] == {"n": 12, "score": 0.65}
    assert ev["metrics"]["regression"]["kinds"]["vqa"] == {"n": 8, "score": 0.625, "anls": 0.7}
    assert ev["sliceDimensions"] == ["annotationSpec", "slice"]
    meta = ev["metadata"]
    assert meta["pipeline_job_id"] == "run-7"
    assert meta["evaluation_report"] == "gs://test-bucket/root/run-7/evaluate/report"
    assert meta["reference"]["name"] == "champion@3" and meta["reference"]["version"] == "3"
    assert meta["reference"]["metrics"]["f1"] == 0.5 and meta["reference"]["delta"]["f1"] == 0.3125
    assert meta["gate"]["passed"] is True and meta["gate"]["reason"].startswith("PASS: f1 0.8125")
    assert meta["gate"]["rules"] == {
        "metric": "f1",
        "min_value": 0.5,
        "min_margin": 0.0,
        "regression_max_drop": {"overall": 0.05, "vqa": 0.15, "ocr": 0.05},
    }
    assert meta["lineage"] == {
        "data_snapshot": "abc123",
        "training_key": "k9",
        "base_model": "gs://b/base",
        "adapter": "gs://b/ad",
        "merged_model": "gs://test-bucket/root/run-7/merged",
    }
    assert meta["regression"]["kinds"]["vqa"]["delta"]["score"] == -0.125

    evaluation = f"{MODEL}@1/evaluations/1"
    [batch] = api.calls("POST", "slices:batchImport")
    assert batch.path.replace("%40", "@") == f"/v1/{evaluation}/slices:batchImport"
    slices = batch.body["modelEvaluationSlices"]
    assert [(s["slice"]["dimension"], s["slice"]["value"]) for s in slices] == [
        ("annotationSpec", "hole"),
        ("annotationSpec", "slot"),
        ("slice", "ocr"),
        ("slice", "vqa"),
    ]
    assert all(s["metricsSchemaUri"] == str(schema_file) for s in slices)
    assert slices[1]["metrics"]["f1"] == 0.7059 and slices[1]["metrics"]["reference"]["f1"] == 0.375
    assert slices[3]["slice"]["sliceSpec"] == {"configs": {"regression_kind": {"value": {"stringValue": "vqa"}}}}
    assert slices[3]["metrics"]["anls"] == 0.7 and slices[3]["metrics"]["delta"]["anls"] == -0.1

    assert out.metadata["evaluation_imported"] is True
    assert out.metadata["evaluation"] == evaluation and out.metadata["evaluation_slices"] == 4
    saved = json.loads((tmp_path / "run-7-reg" / EVALUATION_FILE).read_text())
    assert saved["parent"] == f"{MODEL}@1" and len(saved["slices"]) == 4
    # aiplatform's own client reads it back from the version
    [back] = aiplatform.Model(f"{MODEL}@1", credentials=CRED).list_model_evaluations()
    assert back.resource_name == evaluation and dict(back.metrics)["f1"] == 0.8125


def test_without_labels_or_regression_there_are_no_slice_calls(api, tmp_path):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    out = _register(tmp_path, "run-1", TODAY)
    [imported] = api.calls("POST", "evaluations:import")
    assert imported.body["modelEvaluation"]["metrics"] == TUNED
    assert "evaluationReport" not in imported.body["modelEvaluation"]["metadata"]
    assert api.calls("POST", "slices:batchImport") == []
    assert out.metadata["evaluation_imported"] is True and out.metadata["evaluation_slices"] == 0


def test_slices_go_fifty_a_call(api):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    reg = register_model(build_upload_request("gs://b/m", "qwen-drawings", "", "img:1", "run-1", {}), "test-project",
                         "us-central1", CRED)  # fmt: skip
    labels = {f"label-{i:02d}": {"tuned": {"f1": i / 100}, "reference": {"f1": 0.0}} for i in range(SLICE_BATCH + 1)}
    request = build_evaluation({**TODAY, "labels": labels}, "run-1", SCHEMA_URI)
    done = import_evaluation(f"{reg.resource_name}@{reg.version_id}", request, "us-central1", CRED)
    calls = api.calls("POST", "slices:batchImport")
    assert [len(c.body["modelEvaluationSlices"]) for c in calls] == [SLICE_BATCH, 1]
    assert len(done.slices) == SLICE_BATCH + 1
    assert calls[1].body["modelEvaluationSlices"][0]["slice"]["value"] == f"label-{SLICE_BATCH:02d}"


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [(403, "PERMISSION_DENIED", "403 Forbidden"), (400, "INVALID_ARGUMENT", "400 BadRequest")],
)
def test_a_refused_import_is_one_warning_line_and_the_promotion_stays(api, tmp_path, capsys, code, status, kind):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    api.errors[f"{MODEL}@1/evaluations:import"] = (code, status)
    out = _register(tmp_path, "run-1", WITH_BLOCKS)  # no SystemExit: the version is already the champion
    [line] = capsys.readouterr().err.strip().splitlines()
    answer = f"({kind}: {status} on {MODEL}@1/evaluations:import)"  # the API's own words, without the URL
    assert line.startswith(f"register: WARNING: the evaluation was not imported into {MODEL}@1 {answer}; ")
    assert "grant the pipeline's service account aiplatform.modelEvaluations.import on the model" in line
    assert f"then import {tmp_path / 'run-1-reg' / EVALUATION_FILE} by hand (docs/vertex.md" in line
    assert line.endswith(f"; {MODEL}@1 stays registered and promoted")
    assert out.metadata["evaluation_imported"] is False
    assert out.metadata["evaluation"] == "" and out.metadata["evaluation_slices"] == 0
    assert out.metadata["aliases"] == ["champion", "default"]
    assert api.resources[f"{MODEL}@champion"]["versionId"] == "1"  # promoted, not undone
    assert api.calls("POST", "slices:batchImport") == []
    # once the permission is granted, the saved request imports as docs/vertex.md shows
    del api.errors[f"{MODEL}@1/evaluations:import"]
    saved = json.loads((tmp_path / "run-1-reg" / EVALUATION_FILE).read_text())
    done = import_evaluation(saved["parent"], EvaluationRequest(saved["evaluation"], saved["slices"]), "us-central1")
    assert done.name == f"{MODEL}@1/evaluations/1" and len(done.slices) == 4
    refused, again = api.calls("POST", "evaluations:import")
    assert again.body == refused.body  # the very request register sent


def test_refused_slices_keep_the_evaluation_and_name_their_permission(api, tmp_path, capsys):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    api.errors[f"{MODEL}@1/evaluations/1/slices:batchImport"] = (403, "PERMISSION_DENIED")
    out = _register(tmp_path, "run-1", WITH_BLOCKS, promote=False)
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"register: WARNING: evaluation {MODEL}@1/evaluations/1 was imported but 4 of its 4 slices")
    assert "aiplatform.modelEvaluationSlices.import" in line
    assert line.endswith(f"; {MODEL}@1 stays registered")
    assert out.metadata["evaluation_imported"] is False
    assert out.metadata["evaluation"] == f"{MODEL}@1/evaluations/1"
    assert api.resources[f"{MODEL}@1/evaluations/1"]["displayName"] == "run-1 vs champion@3"


def test_an_unwritable_folder_is_a_warning_and_the_import_still_runs(api, tmp_path):
    init_vertex("test-project", "us-central1", credentials=CRED, api_endpoint=api.url)
    reg = register_model(build_upload_request("gs://b/m", "qwen-drawings", "", "img:1", "run-1", {}), "test-project",
                         "us-central1", CRED)  # fmt: skip
    (tmp_path / "file").write_text("")
    folder = str(tmp_path / "file" / "reg")
    outcome = attach_evaluation(
        folder, f"{reg.resource_name}@1", build_evaluation(TODAY, "run-1", SCHEMA_URI), "us-central1", CRED
    )
    assert outcome.imported and outcome.evaluation == f"{MODEL}@1/evaluations/1"
    [warning] = outcome.warnings
    assert warning.startswith(f"the metrics schema and {EVALUATION_FILE} were not written to {folder} (")
