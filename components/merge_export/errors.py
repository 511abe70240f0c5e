"""The errors merge-export raises; each message says what failed and why."""

from __future__ import annotations


class MergeError(RuntimeError):
    """Merging failed or the merged model does not verify; the message says why."""


class AdapterBaseMismatch(MergeError):
    """The adapter was trained on a different base model than the staged one."""


class MergeVerificationError(MergeError):
    """The merged model's logits differ from base model + adapter beyond the tolerance."""


class QuantizedMergeError(MergeError):
    """The merge would go into quantised weights or over them (merge-export merges into the original bf16 base)."""
