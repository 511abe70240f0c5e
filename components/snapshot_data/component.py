"""KFP wrapper of the snapshot-data core."""

from typing import NamedTuple

from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def snapshot_data(
    train_sources: str,
    eval_sources: str,
    training: dict,
    manifest: dsl.Output[dsl.Dataset],
    champion_uri: str = "",
) -> NamedTuple("Outputs", [("snapshot", str), ("fingerprint", str), ("training_key", str), ("up_to_date", bool)]):
    """Resolves the data sources to the exact files this run reads (never cached).

    Args:
        train_sources: Training data: files, folders / prefixes, globs (local or gs://),
            comma-separated.
        eval_sources: Held-out data, the same way; "" = validate-data splits the training data.
        training: Settings that make the model with the data (base model, swift arguments,
            split and validation settings): part of the training key.
        manifest: Output: the snapshot (every file with generation / hash, size, CRC32C)
            and the skipped non-JSONL files.
        champion_uri: The champion's merged model folder ("" = none): its data lineage says
            what changed, and whether it was trained on exactly this data and these settings.

    Returns:
        snapshot: The snapshot as canonical JSON: validate-data reads exactly these files.
            Identical data gives identical text, so later tasks are cache hits.
        fingerprint: 16-hex fingerprint of the data.
        training_key: 16-hex key of the data and the training settings.
        up_to_date: True when the champion was trained on this very data with these settings.
    """
    from collections import namedtuple

    from components.snapshot_data.core import SnapshotError, snapshot_data as resolve

    try:
        result = resolve(train=train_sources, eval_=eval_sources, training=dict(training),
                         champion_dir=champion_uri, manifest_out=manifest.path)
    except SnapshotError as exc:
        raise SystemExit(f"snapshot-data: {exc}") from None
    print(result.summary, flush=True)
    manifest.metadata.update(result.metadata)
    return namedtuple("Outputs", ["snapshot", "fingerprint", "training_key", "up_to_date"])(
        result.snapshot_json, result.fingerprint, result.training_key, result.up_to_date)
