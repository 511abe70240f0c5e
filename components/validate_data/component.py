"""KFP wrapper of the validate-data core."""

from typing import NamedTuple

from kfp import dsl

from components.images import LIGHT_IMAGE


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def validate_data(
    snapshot: str,
    eval_fraction: float,
    max_invalid_fraction: float,
    split_seed: str,
    base_model: dsl.Input[dsl.Model],
    train_dataset: dsl.Output[dsl.Dataset],
    eval_dataset: dsl.Output[dsl.Dataset],
    quarantine: dsl.Output[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
    report: dsl.Output[dsl.HTML],
    swift_args: dict,
    task: str = "",
    box_convention: str = "pixel",
    training_key: str = "",
    champion_uri: str = "",
    max_pixels: int = 0,
    leakage: str = "quarantine",
) -> NamedTuple("Outputs", [("n_train", int), ("n_eval", int)]):
    """Checks every line of the data; writes clean train/eval datasets and a quarantine.

    Args:
        snapshot: The data snapshot (snapshot-data's output, JSON): exactly these files
            (gs:// generations, local hashes) are read; no eval files = hash split of train.
        eval_fraction: Held-out fraction for the hash split.
        max_invalid_fraction: Largest tolerated fraction of invalid lines.
        split_seed: Salt of the split hash.
        base_model: Staged base model; its tokenizer and image processor settings give
            the token estimate checked against max_length.
        train_dataset: Output: clean training set (data.jsonl + images/).
        eval_dataset: Output: clean held-out set (data.jsonl + images/).
        quarantine: Output: rejected lines with file, line, code and message.
        metrics: Output: line counts, per-check counts, token-count figures.
        report: Output: HTML report (counts by check, token and image-size
            distributions, first errors with thumbnails).
        swift_args: `swift sft` arguments; rows whose token count (as ms-swift encodes
            them, images scaled down to its max_pixels when set) exceeds its max_length are
            rejected (no check without max_length).
        task: Answer check: "" none, "json" or "detection". Default "".
        box_convention: What detection boxes mean: "pixel", "norm1000", "resized_pixel" or
            "auto" (the staged model family's); boxes are checked in it (E_BOX). Default "pixel".
        training_key: Key of the data and training settings (snapshot-data), recorded in
            the data lineage. Default "".
        champion_uri: The champion's merged model folder ("" = none): the report says what
            changed since the data it was trained on. Default "".
        max_pixels: ms-swift's `max_pixels` (px) the training run resizes images with; 0 =
            `swift_args["max_pixels"]` (none when absent). Counts and resized_pixel boxes use
            it; a value that differs from swift_args' is an error. Default 0.
        leakage: An eval row that shares an image (by content) or, without images, its
            prompt with a train row: "quarantine" it (E_LEAK), "error" (the task fails,
            naming both rows) or "warn" (kept). Metrics' n_leaked counts them; the report
            lists them. Default "quarantine".
    """
    from components.common.kfp_outputs import write_outputs
    from components.validate_data.step import OUTPUTS, validate_step

    return write_outputs(
        validate_step(
            snapshot, base_model, train_dataset, eval_dataset, quarantine, report, swift_args, max_pixels,
            eval_fraction=eval_fraction, max_invalid_fraction=max_invalid_fraction, split_seed=split_seed,
            task=task, box_convention=box_convention, training_key=training_key, champion_dir=champion_uri,
            leakage=leakage,
        ),
        metrics,
        OUTPUTS,
        train_dataset=train_dataset, eval_dataset=eval_dataset, quarantine=quarantine,
    )  # fmt: skip


@dsl.component(base_image=LIGHT_IMAGE, install_kfp_package=False)
def validate_regression(
    snapshot: str,
    base_model: dsl.Input[dsl.Model],
    max_invalid_fraction: float,
    swift_args: dict,
    regression_dataset: dsl.Output[dsl.Dataset],
    quarantine: dsl.Output[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
    box_convention: str = "pixel",
) -> int:
    """Checks every line of the regression set (`eval.regression`); writes the clean set and a quarantine.

    The same line, image and duplicate checks as the task data, plus each row's kind (vqa, ocr,
    grounding: E_REGRESSION_KIND) and gold answer (E_REGRESSION_GOLD), and grounding boxes against
    their image (E_BOX). Runs before training: a set that quarantines to nothing stops the run
    before any GPU work.

    Args:
        snapshot: The regression set's snapshot (snapshot-data's `regression_snapshot`).
        base_model: Staged base model: its family resolves box_convention "auto".
        max_invalid_fraction: Largest tolerated fraction of invalid lines (`data.max_invalid_fraction`).
        swift_args: `swift sft` arguments; `max_pixels` sets the resized_pixel box rule.
        regression_dataset: Output: the clean regression set (data.jsonl + images/, completion
            marker; metadata rows, rows per kind, manifest_sha256).
        quarantine: Output: rejected lines with file, line, code and message.
        metrics: Output: line counts, rows per kind, per-code counts.
        box_convention: What grounding boxes mean, as `data.box_convention`. Default "pixel".

    Returns:
        The number of valid regression rows.
    """
    from components.common.kfp_outputs import write_outputs
    from components.validate_data.step import regression_step

    outputs = regression_step(
        snapshot, base_model, regression_dataset, quarantine, swift_args, max_invalid_fraction, box_convention
    )
    write_outputs(outputs, metrics, regression_dataset=regression_dataset, quarantine=quarantine)
    return outputs.values[0]
