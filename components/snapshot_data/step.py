"""The snapshot-data step as its KFP wrapper runs it (pure: no kfp): sources resolved, manifest written.

`snapshot_step` runs `core.snapshot_data` with the component's arguments and returns the
`StepOutputs` (`components.common.kfp_outputs`): the manifest's metadata and the component's
values. A refused source ends it with SystemExit("snapshot-data: ...").
"""

from __future__ import annotations

from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.snapshot_data.core import SnapshotError, snapshot_data

OUTPUTS = ("snapshot", "fingerprint", "training_key", "up_to_date", "model_source", "model_revision",
           "regression_snapshot")  # fmt: skip
"""The component's output names, in the order of `StepOutputs.values`."""


def snapshot_step(
    manifest: ArtifactLike, *, train_sources: str, eval_sources: str, model_source: str, model_revision: str,
    model_token_from: str, swift_args: dict, eval_fraction: float, max_invalid_fraction: float, split_seed: str,
    task: str, box_convention: str = "pixel", leakage: str = "quarantine", champion_uri: str = "",
    regression_sources: str = "",
) -> StepOutputs:  # fmt: skip
    """Runs the snapshot-data step; the arguments are the component's (see `components.snapshot_data.component`).

    Returns:
        metadata of "manifest"; values in `OUTPUTS` order.

    Raises:
        SystemExit: A refused source or setting ("snapshot-data: ...").
    """
    training = {
        "model_source": model_source, "model_revision": model_revision, "swift_args": dict(swift_args),
        "eval_fraction": eval_fraction, "max_invalid_fraction": max_invalid_fraction, "split_seed": split_seed,
        "task": task, "box_convention": box_convention, "leakage": leakage,
    }  # fmt: skip
    try:
        result = snapshot_data(
            train=train_sources, eval_=eval_sources, champion_dir=champion_uri, manifest_out=manifest.path,
            token_from=model_token_from, regression=regression_sources, training=training,
        )  # fmt: skip
    except SnapshotError as exc:
        raise SystemExit(f"snapshot-data: {exc}") from None
    print(result.summary, flush=True)
    values = (result.snapshot_json, result.fingerprint, result.training_key, result.up_to_date, result.model_source,
              result.model_revision, result.regression_json)  # fmt: skip
    return StepOutputs(metadata={"manifest": result.metadata}, values=values)
