"""snapshot-data: sources (files, folders / prefixes, globs; local and gs://) to an exact snapshot."""

import json

import pytest

from components.common import snapshot as snap
from components.common.snapshot import SnapshotError
from components.snapshot_data.core import glob_regex, resolve_sources, summary

ROW = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}\n'


def _write(path, data=ROW):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------- globs


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("d/2026-*/part-*.jsonl", "d/2026-01/part-0.jsonl", True),
        ("d/2026-*/part-*.jsonl", "d/2026-01/x/part-0.jsonl", False),  # * stays in one segment
        ("d/**/*.jsonl", "d/a/b/c.jsonl", True),
        ("d/**/*.jsonl", "d/c.jsonl", True),
        ("d/part-?.jsonl", "d/part-10.jsonl", False),
        ("d/part-[0-4].jsonl", "d/part-3.jsonl", True),
        ("d/part-[!0-4].jsonl", "d/part-3.jsonl", False),
        ("d/a.b.jsonl", "d/aXb.jsonl", False),  # dots are literal
    ],
)
def test_glob_semantics(pattern, name, matches):
    assert bool(glob_regex(pattern).match(name)) is matches


# ---------------------------------------------------------------- local


def test_local_folder_glob_and_file_resolve_to_jsonl_files_with_hashes(tmp_path):
    a = _write(tmp_path / "data" / "2026-01" / "part-0.jsonl")
    b = _write(tmp_path / "data" / "2026-02" / "part-0.jsonl", ROW * 2)
    _write(tmp_path / "data" / "2026-01" / "images" / "x.png", b"png")
    _write(tmp_path / "data" / "README.md", b"notes")
    held = _write(tmp_path / "held" / "eval.jsonl")

    res = resolve_sources(f"{tmp_path}/data/", str(held))
    s = res.snapshot
    assert [e["uri"] for e in s["train"]] == [str(a), str(b)]
    assert [e["uri"] for e in s["eval"]] == [str(held)]
    assert s["train"][1]["size"] == len(ROW) * 2 and len(s["train"][1]["sha256"]) == 64
    assert s["train"][0]["assets"]["count"] == 1  # images/x.png under part-0's folder
    assert res.skipped == 2 and any(p.endswith("README.md") for p in res.skipped_examples)
    assert snap.parse(json.dumps(s)) == s

    by_glob = resolve_sources(f"{tmp_path}/data/2026-*/part-*.jsonl", str(held)).snapshot
    assert by_glob == s  # same files, same snapshot, same fingerprint


def test_identical_data_gives_identical_snapshot_text_and_a_change_gives_another(tmp_path):
    shard = _write(tmp_path / "d" / "part-0.jsonl")
    first = snap.canonical(resolve_sources(str(tmp_path / "d")).snapshot)
    assert snap.canonical(resolve_sources(str(tmp_path / "d")).snapshot) == first

    shard.write_bytes(ROW + ROW)  # appended rows
    appended = resolve_sources(str(tmp_path / "d")).snapshot
    assert snap.canonical(appended) != first

    shard.write_bytes(ROW.replace(b"ok", b"no") + ROW)  # same size, other content, same name
    overwritten = resolve_sources(str(tmp_path / "d")).snapshot
    assert overwritten["fingerprint"] != appended["fingerprint"]


def test_a_replaced_image_under_the_dataset_folder_changes_the_snapshot(tmp_path):
    _write(tmp_path / "d" / "part-0.jsonl")
    img = _write(tmp_path / "d" / "images" / "x.png", b"old")
    before = resolve_sources(str(tmp_path / "d")).snapshot["fingerprint"]
    img.write_bytes(b"new image")
    assert resolve_sources(str(tmp_path / "d")).snapshot["fingerprint"] != before


def test_a_source_that_matches_no_jsonl_is_a_named_error(tmp_path):
    _write(tmp_path / "d" / "image.png", b"png")
    with pytest.raises(SnapshotError, match=r"matches no \.jsonl file \(1 other files there"):
        resolve_sources(str(tmp_path / "d"))
    with pytest.raises(SnapshotError, match="matches no .jsonl file"):
        resolve_sources(f"{tmp_path}/nothing-*.jsonl")
    with pytest.raises(SnapshotError, match="no such file or folder"):
        resolve_sources(str(tmp_path / "missing.jsonl"))
    with pytest.raises(SnapshotError, match="data.train is empty"):
        resolve_sources(" , ")


def test_a_file_both_in_train_and_eval_is_refused(tmp_path):
    f = _write(tmp_path / "a.jsonl")
    with pytest.raises(SnapshotError, match="both training and held-out"):
        resolve_sources(str(f), str(tmp_path))


def test_read_entry_refuses_a_local_file_changed_or_deleted_after_the_snapshot(tmp_path):
    f = _write(tmp_path / "a.jsonl")
    entry = resolve_sources(str(f)).snapshot["train"][0]
    assert snap.read_entry(entry) == ROW
    f.write_bytes(ROW.replace(b"hi", b"ho"))
    with pytest.raises(SnapshotError, match="overwritten since the data snapshot"):
        snap.read_entry(entry)
    f.unlink()
    with pytest.raises(SnapshotError, match="deleted since the data snapshot"):
        snap.read_entry(entry)


def test_parse_refuses_an_edited_snapshot(tmp_path):
    s = resolve_sources(str(_write(tmp_path / "a.jsonl"))).snapshot
    s["train"][0]["size"] += 1
    with pytest.raises(SnapshotError, match="fingerprint does not match"):
        snap.parse(json.dumps(s))
    with pytest.raises(SnapshotError, match="not valid JSON"):
        snap.parse("{")


def test_summary_says_no_new_data_or_what_changed_since_the_previous_snapshot(tmp_path):
    a = _write(tmp_path / "d" / "a.jsonl")
    old = resolve_sources(str(tmp_path / "d"))
    assert "no new data since snapshot " + old.snapshot["fingerprint"] in summary(old, old.snapshot)
    _write(tmp_path / "d" / "b.jsonl")
    a.write_bytes(ROW * 3)
    new = resolve_sources(str(tmp_path / "d"))
    change = snap.diff(old.snapshot, new.snapshot)
    assert change.added == [str(tmp_path / "d" / "b.jsonl")] and change.changed == [str(a)] and not change.removed
    assert "1 file(s) added, 0 removed, 1 changed" in summary(new, old.snapshot)


# ---------------------------------------------------------------- Cloud Storage (emulator)


def _upload(client, bucket, name, data=ROW):
    blob = client.bucket(bucket).blob(name)
    blob.upload_from_string(data)
    return blob


def test_gs_prefix_and_glob_listing(gcs_client, gcs_bucket):
    for name in ("drawings/2026-01/part-0.jsonl", "drawings/2026-01/part-1.jsonl", "drawings/2026-02/part-0.jsonl"):
        _upload(gcs_client, gcs_bucket, name)
    _upload(gcs_client, gcs_bucket, "drawings/2026-01/images/a.png", b"png")
    _upload(gcs_client, gcs_bucket, "other/x.jsonl")

    res = resolve_sources(f"gs://{gcs_bucket}/drawings/")
    uris = [e["uri"] for e in res.snapshot["train"]]
    assert uris == [
        f"gs://{gcs_bucket}/drawings/{n}"
        for n in ("2026-01/part-0.jsonl", "2026-01/part-1.jsonl", "2026-02/part-0.jsonl")
    ]
    assert res.skipped == 1
    entry = res.snapshot["train"][0]
    assert entry["size"] == len(ROW) and entry["generation"] and entry["crc32c"] == snap.crc32c_b64(ROW)
    assert entry["assets"]["count"] == 1

    glob = resolve_sources(f"gs://{gcs_bucket}/drawings/2026-*/part-0.jsonl").snapshot
    assert [e["uri"] for e in glob["train"]] == [uris[0], uris[2]]
    no_slash = resolve_sources(f"gs://{gcs_bucket}/drawings").snapshot  # a folder without its slash
    assert no_slash == res.snapshot
    both = resolve_sources(f"gs://{gcs_bucket}/drawings/2026-01/part-0.jsonl,gs://{gcs_bucket}/other/").snapshot
    assert [e["uri"] for e in both["train"]] == [uris[0], f"gs://{gcs_bucket}/other/x.jsonl"]


def test_gs_sources_that_match_nothing_are_named_errors(gcs_client, gcs_bucket):
    _upload(gcs_client, gcs_bucket, "d/a.png", b"png")
    with pytest.raises(SnapshotError, match=r"matches no \.jsonl file"):
        resolve_sources(f"gs://{gcs_bucket}/d/")
    with pytest.raises(SnapshotError, match="matches no .jsonl file"):
        resolve_sources(f"gs://{gcs_bucket}/d/*.jsonl")
    with pytest.raises(SnapshotError, match="no such object or prefix"):
        resolve_sources(f"gs://{gcs_bucket}/nope.jsonl")
    with pytest.raises(SnapshotError, match="bucket not found"):
        resolve_sources("gs://no-such-bucket-xyz/d/")


def test_gs_overwrite_between_snapshot_and_read_is_detected_by_generation(gcs_client, gcs_bucket):
    _upload(gcs_client, gcs_bucket, "d/part-0.jsonl")
    first = resolve_sources(f"gs://{gcs_bucket}/d/").snapshot
    assert snap.read_entry(first["train"][0]) == ROW

    _upload(gcs_client, gcs_bucket, "d/part-0.jsonl", ROW + ROW)  # same name, new generation
    second = resolve_sources(f"gs://{gcs_bucket}/d/").snapshot
    assert second["train"][0]["generation"] != first["train"][0]["generation"]
    assert snap.canonical(second) != snap.canonical(first)
    with pytest.raises(SnapshotError, match="overwritten since the data snapshot was taken"):
        snap.read_entry(first["train"][0])

    gcs_client.bucket(gcs_bucket).blob("d/part-0.jsonl").delete()
    with pytest.raises(SnapshotError, match="deleted since the data snapshot"):
        snap.read_entry(second["train"][0])


def test_gs_identical_listing_gives_identical_snapshot(gcs_client, gcs_bucket):
    _upload(gcs_client, gcs_bucket, "d/part-0.jsonl")
    _upload(gcs_client, gcs_bucket, "d/img/a.png", b"png")
    a = snap.canonical(resolve_sources(f"gs://{gcs_bucket}/d/").snapshot)
    assert snap.canonical(resolve_sources(f"gs://{gcs_bucket}/d/").snapshot) == a
    _upload(gcs_client, gcs_bucket, "d/img/a.png", b"png2")  # an image replaced under the dataset folder
    assert snap.canonical(resolve_sources(f"gs://{gcs_bucket}/d/").snapshot) != a


def test_the_task_says_up_to_date_only_when_the_champion_saw_this_data_with_these_settings(tmp_path):
    from components.common.snapshot import LINEAGE_FILE
    from components.snapshot_data.core import snapshot_data

    _write(tmp_path / "d" / "a.jsonl")
    settings = {"model_source": "gs://b/models/qwen3-vl-4b", "swift_args": {"learning_rate": 1e-4}}
    first = snapshot_data(train=str(tmp_path / "d"), training=settings, manifest_out=tmp_path / "m.json")
    assert not first.up_to_date and json.loads(first.snapshot_json)["fingerprint"] == first.fingerprint
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["training_key"] == first.training_key and manifest["skipped"]["count"] == 0

    champion = tmp_path / "champion"
    champion.mkdir()
    (champion / LINEAGE_FILE).write_text(
        json.dumps({"snapshot": json.loads(first.snapshot_json), "training_key": first.training_key})
    )
    again = snapshot_data(train=str(tmp_path / "d"), training=settings, champion_dir=str(champion))
    assert again.up_to_date and "no new data since snapshot " + first.fingerprint in again.summary
    other_lr = snapshot_data(
        train=str(tmp_path / "d"),
        training={**settings, "swift_args": {"learning_rate": 2e-4}},
        champion_dir=str(champion),
    )
    assert not other_lr.up_to_date and other_lr.fingerprint == first.fingerprint
    _write(tmp_path / "d" / "b.jsonl")
    new_data = snapshot_data(train=str(tmp_path / "d"), training=settings, champion_dir=str(champion))
    assert not new_data.up_to_date and "1 file(s) added" in new_data.summary
    assert not snapshot_data(train=str(tmp_path / "d"), training=settings, champion_dir=str(tmp_path)).up_to_date


# ---------------------------------------------------------------- the model side: hub revisions pinned


def test_an_unpinned_hub_model_is_pinned_to_its_commit_and_a_new_commit_changes_the_key(hub_server, tmp_path):
    from components.snapshot_data.core import pin_model, snapshot_data
    from tests.conftest import HubRepo

    hub_server.repos["org/tiny"] = HubRepo({"config.json": b"{}"})
    source, revision, note = pin_model("hf://org/tiny")
    first_commit = source.rsplit("@", 1)[1]
    assert source.startswith("hf://org/tiny@") and len(first_commit) == 40 and revision == "" and "commit" in note
    assert pin_model(f"hf://org/tiny@{first_commit}")[0] == source  # a commit stays pinned, no look-up needed

    _write(tmp_path / "d" / "a.jsonl")
    before = snapshot_data(train=str(tmp_path / "d"), training={"model_source": "hf://org/tiny", "model_revision": ""})
    assert before.model_source == source
    new_commit = hub_server.repos["org/tiny"].add_commit("main", {"config.json": b'{"a": 1}'})
    after = snapshot_data(train=str(tmp_path / "d"), training={"model_source": "hf://org/tiny", "model_revision": ""})
    assert after.model_source == f"hf://org/tiny@{new_commit}" and after.training_key != before.training_key
    assert after.fingerprint == before.fingerprint  # same data
    assert pin_model("gs://b/models/qwen", "") == ("gs://b/models/qwen", "", "")  # content-fingerprinted by staging
    with pytest.raises(SnapshotError, match="org/missing"):
        pin_model("hf://org/missing")


def test_cli_prints_the_snapshot_and_fails_cleanly_on_a_source_that_matches_nothing(tmp_path):
    import subprocess
    import sys

    _write(tmp_path / "d" / "part-0.jsonl")
    out = tmp_path / "manifest.json"
    ok = subprocess.run(
        [sys.executable, "-m", "components.snapshot_data", f"{tmp_path}/d/", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0 and "1 train file(s)" in ok.stdout and "part-0.jsonl" in ok.stdout
    assert json.loads(out.read_text())["train"][0]["uri"].endswith("part-0.jsonl")
    bad = subprocess.run(
        [sys.executable, "-m", "components.snapshot_data", f"{tmp_path}/none-*.jsonl"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "matches no .jsonl file" in bad.stderr and "Traceback" not in bad.stderr


def test_the_kfp_wrapper_returns_every_declared_output(tmp_path):
    from kfp import dsl

    from components.snapshot_data import snapshot_data as component

    _write(tmp_path / "d" / "a.jsonl")
    manifest = dsl.Dataset(uri=str(tmp_path / "manifest"))
    manifest.path = str(tmp_path / "manifest.json")
    out = component.python_func(
        train_sources=str(tmp_path / "d"),
        eval_sources="",
        manifest=manifest,
        model_source="gs://b/models/qwen",
        model_revision="",
        model_token_from="",
        swift_args={"learning_rate": 1e-4},
        eval_fraction=0.1,
        max_invalid_fraction=0.0,
        split_seed="split-v1",
        task="detection",
    )
    declared = component.component_spec.outputs
    assert set(out._fields) == set(declared) - {"manifest"}
    assert out.model_source == "gs://b/models/qwen" and out.up_to_date is False
    assert json.loads(out.snapshot)["fingerprint"] == out.fingerprint == manifest.metadata["fingerprint"]
    assert json.loads((tmp_path / "manifest.json").read_text())["training_key"] == out.training_key
