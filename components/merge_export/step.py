"""The merge-export step as its KFP wrapper runs it (pure: no kfp): adapter merged, verified, with lineage.

`merge_step` runs `core.merge_export` on the artifacts' paths and returns the `StepOutputs`
(`components.common.kfp_outputs`): the merged model's metadata (the core's, then its base
model, adapter and model_type). A refused or unverified merge ends it with
SystemExit("merge-export: <error type>: ...").
"""

from __future__ import annotations

import tempfile

from components.common.kfp_outputs import ArtifactLike, StepOutputs
from components.merge_export.core import MergeDiskError, MergeError, merge_export


def merge_step(base_model: ArtifactLike, adapter: ArtifactLike, merged_model: ArtifactLike) -> StepOutputs:
    """Runs the merge-export step; the arguments are the component's (see `components.merge_export.component`).

    Returns:
        metadata of "merged_model".

    Raises:
        SystemExit: The adapter does not fit the base model, the merge failed or did not verify, or the
            disk is too small ("merge-export: <error type>: ...").
    """
    try:
        result = merge_export(
            adapter.path,
            base_model.path,
            merged_model.path,
            tempfile.mkdtemp(prefix="merge-"),
            adapter_marker=adapter.metadata.get("manifest_sha256", ""),
        )
    except (MergeError, MergeDiskError) as exc:  # AdapterBaseMismatch and MergeVerificationError included
        raise SystemExit(f"merge-export: {type(exc).__name__}: {exc}") from None
    meta = {
        **result.metadata,
        "base_model": base_model.uri,
        "adapter": adapter.uri,
        "model_type": base_model.metadata.get("model_type", ""),
    }
    return StepOutputs(metadata={"merged_model": meta})
