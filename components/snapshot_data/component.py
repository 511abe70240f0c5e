"""KFP wrapper of the snapshot-data core."""

from typing import NamedTuple

from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def snapshot_data(
    train_sources: str,
    eval_sources: str,
    manifest: dsl.Output[dsl.Dataset],
    model_source: str,
    model_revision: str,
    model_token_from: str,
    swift_args: dict,
    eval_fraction: float,
    max_invalid_fraction: float,
    split_seed: str,
    task: str,
    box_convention: str = "pixel",
    leakage: str = "quarantine",
    champion_uri: str = "",
    regression_sources: str = "",
) -> NamedTuple(
    "Outputs",
    [
        ("snapshot", str),
        ("fingerprint", str),
        ("training_key", str),
        ("up_to_date", bool),
        ("model_source", str),
        ("model_revision", str),
        ("regression_snapshot", str),
    ],
):
    """Resolves the data sources to the exact files this run reads (never cached).

    Args:
        train_sources: Training data: files, folders / prefixes, globs (local or gs://),
            comma-separated.
        eval_sources: Held-out data, the same way; "" = validate-data splits the training data.
        model_source: Base model source; with the next six, the settings that make the
            model with the data: they and the data make the training key.
        model_revision: Base model revision as configured; a hub branch or tag (or none)
            is pinned to its commit now.
        model_token_from: Hub token source of a gated model (env:VAR or a Secret Manager
            name; never the token).
        swift_args: `swift sft` arguments.
        eval_fraction: Held-out fraction of the hash split.
        max_invalid_fraction: Largest tolerated fraction of invalid lines.
        split_seed: Salt of the split hash.
        task: validate-data's answer check.
        box_convention: What the data's detection boxes mean (part of the training key).
        leakage: What validate-data does with an eval row that shares an image or prompt with a
            train row (part of the training key: it changes the splits). Default "quarantine".
        manifest: Output: the snapshot (every file with generation / hash, size, CRC32C)
            and the skipped non-JSONL files.
        champion_uri: The champion's merged model folder ("" = none): its data lineage says
            what changed, and whether it was trained on exactly this data and these settings.
        regression_sources: The regression set (`eval.regression`), the same forms as the data;
            "" = none. Default "".

    Returns:
        snapshot: The snapshot as canonical JSON: validate-data reads exactly these files.
            Identical data gives identical text, so later tasks are cache hits.
        fingerprint: 16-hex fingerprint of the data.
        training_key: 16-hex key of the data and the training settings.
        up_to_date: True when the champion was trained on this very data with these settings.
        model_source: The model source to stage, a hub source pinned to its current commit
            (`hf://org/name@<commit>`), so a new commit is a cache miss for stage-model.
        model_revision: The revision to stage it with ("" once pinned into the source).
        regression_snapshot: The regression set's own snapshot (canonical JSON) for
            validate-regression; "" without one. Outside the fingerprint and the training key.
    """
    from components.common.kfp_outputs import write_outputs
    from components.snapshot_data.step import OUTPUTS, snapshot_step

    return write_outputs(
        snapshot_step(
            manifest, train_sources=train_sources, eval_sources=eval_sources, model_source=model_source,
            model_revision=model_revision, model_token_from=model_token_from, swift_args=swift_args,
            eval_fraction=eval_fraction, max_invalid_fraction=max_invalid_fraction, split_seed=split_seed, task=task,
            box_convention=box_convention, leakage=leakage, champion_uri=champion_uri,
            regression_sources=regression_sources,
        ),
        names=OUTPUTS,
        manifest=manifest,
    )  # fmt: skip


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def nothing_to_train(fingerprint: str, training_key: str) -> bool:
    """Ends a run whose data and settings the champion was already trained on (no GPU job).

    Args:
        fingerprint: The data snapshot's fingerprint.
        training_key: The key of data and settings, equal to the champion's.

    Returns:
        False: no new model this run (the pipeline's `passed` output).
    """
    print(
        f"no new data since snapshot {fingerprint}: the champion was trained on it with these settings "
        f"(training key {training_key}); nothing to train, no GPU job started",
        flush=True,
    )
    return False
