"""The reference model evaluate compares the tuned model with: every decision about it.

`eval.reference` is decided in three steps, all here:

1. `reference_problem` (config load): is the value allowed?
2. `plan_reference` (pipeline build): what it means for a target: the staged base
   model, the registry's champion (looked up by find-champion at run time) or a folder.
3. `resolve_reference` (in evaluate, at run time): which folder to load, given what
   find-champion found.

Pure (no kfp, no cloud client), so `pipelines/` and `components/` both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from components.common.storage import to_fuse_path

# What `eval.reference` may say besides a model folder.
KEYWORDS = ("auto", "base", "champion")
# What the reference turns out to be: the staged base model, the registry's champion, a given folder.
KINDS = ("base", "champion", "folder")
BASE, CHAMPION, FOLDER = KINDS


def reference_problem(reference: str) -> str | None:
    """Checks `eval.reference`: a keyword, a gs:// URI, a /gcs/ path or an existing local model folder.

    Args:
        reference: The value, e.g. "auto", "champion", "gs://bucket/models/merged".

    Returns:
        None when valid, else what is wrong and how to fix it.
    """
    if reference in KEYWORDS:
        return None
    if not reference.strip():
        return "must be auto, base, champion, a gs:// model folder or a local model folder"
    if reference.startswith("gs://"):
        bucket, _, prefix = reference[len("gs://") :].partition("/")
        return None if bucket and prefix.strip("/") else "a gs:// reference must name a folder: gs://BUCKET/PATH"
    if reference.startswith("/gcs/"):
        return None  # Cloud Storage FUSE path of a Vertex task; not visible here
    if "://" in reference:
        return "must be auto, base, champion, a gs:// URI or a local folder (no other URI schemes)"
    folder = Path(reference).expanduser()
    if not folder.is_dir():
        return f"folder {folder.resolve()} not found (expected auto, base, champion, gs://... or a model folder)"
    if not (folder / "config.json").is_file():
        return f"folder {folder.resolve()} has no config.json; it is not a merged model folder"
    return None


def plan_reference(reference: str, *, vertex: bool, model_id: str, serving_image: str, alias: str) -> tuple[str, str]:
    """Decides, when the pipeline is built, what evaluate compares the tuned model with.

    Args:
        reference: `eval.reference`, already checked by `reference_problem`.
        vertex: Whether the target is Vertex (the local target has no registry).
        model_id: `register.model_id` ("" = the pipeline name).
        serving_image: `register.serving_image` ("" = no register step).
        alias: `register.alias`, the alias that marks the champion.

    Returns:
        (kind, uri): (BASE, "") for the staged base model; (CHAMPION, "") for the registry's
        champion, looked up at run time (Vertex only); (FOLDER, uri) for a given model folder
        (gs:// or /gcs/ on Vertex; an absolute local path locally). `auto` is the champion on
        Vertex when the config names a registry model (model_id or serving_image, and an
        alias), else the base.

    Raises:
        ValueError: A local folder as reference on the Vertex target (its tasks cannot read it).
    """
    if reference == "auto":
        names_a_model = bool(model_id or serving_image) and bool(alias)
        reference = CHAMPION if vertex and names_a_model else BASE
    if reference == CHAMPION:
        return (CHAMPION, "") if vertex else (BASE, "")  # no registry locally
    if reference == BASE:
        return BASE, ""
    if reference.startswith(("gs://", "/gcs/")):
        return FOLDER, reference.rstrip("/")
    if vertex:
        raise ValueError(
            f"'eval.reference' {reference!r} is a local folder, which Vertex tasks cannot read; "
            "upload it and give its gs:// URI"
        )
    return FOLDER, str(Path(reference).expanduser().resolve())


@dataclass(frozen=True)
class Reference:
    """The model the tuned model is compared with, as evaluate records it.

    Attributes:
        model_dir: Folder to load (a gs:// URI mapped to its /gcs/ FUSE path).
        kind: One of `KINDS`: "base", "champion" or "folder" (a model folder given in the config).
        label: Short name for metrics, labels and the report: "base", "champion@VERSION"
            or the folder's URI.
        version: The champion's registry version ID; "" otherwise.
    """

    model_dir: str
    kind: str
    label: str
    version: str = ""

    def metrics(self) -> dict[str, float]:
        """Numeric facts for the Metrics artifact: reference_is_champion, reference_version (0 = none)."""
        version = float(self.version) if self.version.isdigit() else 0.0
        return {"reference_is_champion": float(self.kind == CHAMPION), "reference_version": version}


def resolve_reference(reference_uri: str, reference_version: str, base_model_dir: str) -> Reference:
    """Decides, at run time, which model folder is the reference.

    Args:
        reference_uri: The champion's or a configured model folder (gs:// or a path);
            "" = the base model (also when find-champion found no champion).
        reference_version: The champion's registry version ID; "" = not a champion.
        base_model_dir: The staged base model folder.

    Returns:
        The Reference; a gs:// URI becomes its /gcs/ FUSE path (how Vertex tasks read it).
    """
    if not reference_uri:
        return Reference(base_model_dir, BASE, BASE)
    model_dir = to_fuse_path(reference_uri.rstrip("/"))
    if reference_version:
        return Reference(model_dir, CHAMPION, f"{CHAMPION}@{reference_version}", reference_version)
    return Reference(model_dir, FOLDER, reference_uri.rstrip("/"))
