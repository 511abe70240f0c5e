"""The stage-model step as its KFP wrapper runs it (pure: no kfp): the model staged, the artifact pointed at it.

`stage_step` runs `core.stage_model` with the component's arguments (progress lines on) and
returns the `StepOutputs` (`components.common.kfp_outputs`): the cache entry as the "model"
artifact's URI and `core.result_summary` as its metadata. A refused source ends it with
SystemExit("stage-model: ...").
"""

from __future__ import annotations

from components.common.kfp_outputs import StepOutputs
from components.stage_model.core import StageError, result_summary, stage_model


def stage_step(source: str, cache: str, revision: str, token_from: str, allow: list, ignore: list) -> StepOutputs:
    """Runs the stage-model step; the arguments are the component's (see `components.stage_model.component`).

    Returns:
        uri and metadata of "model".

    Raises:
        SystemExit: A refused source, cache or token ("stage-model: ...").
    """
    try:
        result = stage_model(
            source,
            cache,
            allow or None,
            ignore or None,
            revision=revision or None,
            token_from=token_from or None,
            progress=True,  # rate-limited lines in the task's log: one per 5 % or 30 s
        )
    except StageError as exc:
        raise SystemExit(f"stage-model: {exc}") from None
    print(
        f"stage-model: {'cache hit' if result.cache_hit else 'staged'} {result.entry} "
        f"({result.bytes_copied} bytes copied)"
    )
    return StepOutputs(metadata={"model": result_summary(result)}, uris={"model": result.entry})
