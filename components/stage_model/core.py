"""Stage a base model into the model cache, verified, once.

A cache entry is a folder `<cache>/<scheme>/<name>/<revision>/` holding the model files
and `manifest.json` (files, sizes, sha256, source, revision, time). The manifest is
written last, atomically: an entry without a manifest, or whose files do not match it,
is not trusted and is repaired by copying again. A valid entry is reused with nothing
copied (a cache hit).

Sources handled here: a local model folder. Its revision is a fingerprint of its
content (sha256 over file names, sizes and hashes), so a changed folder is a new entry.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import struct
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 8 * 1024 * 1024

# Architectures ms-swift can LoRA-tune with this pipeline, mapped to ms-swift model_type.
SUPPORTED_ARCHITECTURES = {
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_moe_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
}
# Never staged: VCS and cache folders, and partial files of other stagers.
DEFAULT_IGNORE = (".git/*", ".cache/*", "*.partial-*", MANIFEST)


class StageError(RuntimeError):
    """Staging failed; the message names the source or file and the fix."""


@dataclass
class StageResult:
    """What staging produced.

    Attributes:
        entry: The verified cache entry folder (the Model artifact's location).
        cache_hit: True when a valid entry existed and nothing was copied.
        bytes_copied: Bytes written into the cache by this call.
        manifest: The entry's manifest.
        metadata: Model facts for the artifact: architecture, model_type, parameters, dtype.
    """

    entry: str
    cache_hit: bool
    bytes_copied: int
    manifest: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


def sha256_file(path: Path) -> str:
    """Returns the hex sha256 of a file, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(folder: Path, allow: list[str] | None = None, ignore: list[str] | None = None) -> list[str]:
    """Lists a folder's files as sorted POSIX relative paths, filtered by glob patterns.

    Args:
        folder: The model folder.
        allow: Keep only paths matching one of these globs; None keeps all. Default None.
        ignore: Drop paths matching one of these globs (added to DEFAULT_IGNORE). Default None.

    Returns:
        Relative file paths, sorted.
    """
    patterns = list(DEFAULT_IGNORE) + list(ignore or [])
    out = []
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(folder).as_posix()
        if any(fnmatch.fnmatch(rel, p) for p in patterns):
            continue
        if allow and not any(fnmatch.fnmatch(rel, p) for p in allow):
            continue
        out.append(rel)
    return sorted(out)


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Reads a safetensors file's JSON header without loading tensors."""
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw_len)
            if n > 100 * 1024 * 1024 or n > path.stat().st_size - 8:
                raise ValueError(f"header length {n} exceeds the file")
            header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            header.pop("__metadata__", None)
            for name, info in header.items():
                if not (
                    isinstance(info, dict)
                    and isinstance(info.get("dtype"), str)
                    and isinstance(info.get("shape"), list)
                    and all(isinstance(d, int) for d in info["shape"])
                    and isinstance(info.get("data_offsets"), list)
                    and len(info["data_offsets"]) == 2
                    and all(isinstance(o, int) for o in info["data_offsets"])
                ):
                    raise ValueError(f"tensor {name!r} needs dtype, shape and data_offsets")
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: unreadable safetensors header ({exc}); re-export the weights") from None
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    if 8 + n + end > path.stat().st_size:
        raise StageError(f"{path}: truncated safetensors file (tensor data ends past the file); copy it again")
    return header


def check_model(folder: Path, files: list[str]) -> dict[str, Any]:
    """Checks that a folder holds a model this pipeline can train.

    Args:
        folder: The model folder.
        files: Its relative file list.

    Returns:
        Metadata: architecture, model_type, num_parameters, dtype, torch_dtype.

    Raises:
        StageError: config.json missing or unparsable, unsupported architecture, tokenizer
            or processor files missing, no safetensors, an indexed shard missing, or an
            unreadable safetensors header. The message names the file and the fix.
    """
    config_path = folder / "config.json"
    if "config.json" not in files:
        raise StageError(f"{folder}: no config.json; this does not look like a Hugging Face model folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"{config_path}: cannot parse ({exc})") from None
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise StageError(
            f"{config_path}: architecture {arch or '(none)'!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if "tokenizer_config.json" not in files or not (
        "tokenizer.json" in files or {"vocab.json", "merges.txt"} <= set(files)
    ):
        raise StageError(f"{folder}: tokenizer files missing (need tokenizer_config.json and tokenizer.json)")
    if "preprocessor_config.json" not in files and "processor_config.json" not in files:
        raise StageError(f"{folder}: image processor missing (need preprocessor_config.json)")
    shards = [f for f in files if f.endswith(".safetensors")]
    if not shards:
        raise StageError(f"{folder}: no *.safetensors weights; convert the model to safetensors first")
    if "model.safetensors.index.json" in files:
        index_path = folder / "model.safetensors.index.json"
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise StageError(f"{index_path}: cannot parse ({exc})") from None
        missing = sorted(set(weight_map.values()) - set(shards))
        if missing:
            raise StageError(f"{index_path}: shard(s) listed but not present: {', '.join(missing)}")
    n_params, dtypes = 0, {}
    for shard in shards:
        for info in _safetensors_header(folder / shard).values():
            count = 1
            for dim in info["shape"]:
                count *= dim
            n_params += count
            dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + count
    text = config.get("text_config") or {}
    return {
        "architecture": arch,
        "model_type": SUPPORTED_ARCHITECTURES[arch],
        "num_parameters": n_params,
        "dtype": max(dtypes, key=dtypes.get) if dtypes else "",
        "torch_dtype": str(config.get("torch_dtype") or config.get("dtype") or text.get("dtype") or ""),
    }


def local_revision(folder: Path, files: list[str], hashes: dict[str, str]) -> str:
    """Returns a content fingerprint of a local folder: 'sha256-' + 16 hex digits."""
    digest = hashlib.sha256()
    for rel in files:
        digest.update(f"{rel}\0{hashes[rel]}\n".encode())
    return "sha256-" + digest.hexdigest()[:16]


def verify_entry(entry: Path) -> tuple[bool, str]:
    """Checks a cache entry against its manifest (sizes and sha256 of every file).

    Returns:
        (valid, reason): reason says what is wrong when not valid.
    """
    manifest_path = entry / MANIFEST
    if not manifest_path.is_file():
        return False, "no manifest (incomplete entry)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = {rel: (info["size"], info["sha256"]) for rel, info in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return False, f"unreadable manifest ({exc!r})"
    for rel, (size, sha) in files.items():
        path = entry / rel
        if not path.is_file():
            return False, f"{rel}: missing"
        if path.stat().st_size != size:
            return False, f"{rel}: size {path.stat().st_size} != {size}"
        if sha256_file(path) != sha:
            return False, f"{rel}: sha256 mismatch"
    return True, "ok"


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".partial-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _copy_verified(src: Path, dst: Path, expected_sha: str) -> int:
    """Copies src to dst through a temporary name; returns bytes written."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=dst.name + ".partial-")
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != expected_sha:
            raise StageError(f"{src}: changed while being copied (sha256 differs); stage again")
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return size


def stage_local(
    source: str | Path,
    cache: str | Path,
    allow: list[str] | None = None,
    ignore: list[str] | None = None,
) -> StageResult:
    """Stages a local model folder into a local model cache.

    Args:
        source: The model folder.
        cache: Cache root; the entry is `<cache>/local/<folder name>/<content revision>/`.
        allow: Only stage files matching these globs. Default None (all).
        ignore: Skip files matching these globs. Default None.

    Returns:
        The StageResult; `cache_hit` is True when the entry was already valid.

    Raises:
        StageError: The source is missing or not a valid model (see `check_model`), or a
            file changed while being copied. Nothing is left that looks like a valid entry.
    """
    src = Path(source).expanduser()
    if not src.is_dir():
        raise StageError(f"model source {str(source)!r}: folder not found; pass an existing model folder")
    src = src.resolve()
    files = list_files(src, allow, ignore)
    if not files:
        raise StageError(f"model source {src}: no files to stage (after allow/ignore patterns)")
    meta = check_model(src, files)
    hashes = {rel: sha256_file(src / rel) for rel in files}
    revision = local_revision(src, files, hashes)
    entry = Path(cache).expanduser().resolve() / "local" / src.name / revision

    valid, reason = verify_entry(entry)
    if valid:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        return StageResult(str(entry), True, 0, manifest, {**meta, "cache_hit": True})

    entry.mkdir(parents=True, exist_ok=True)
    stale = entry / MANIFEST
    if stale.exists():  # a manifest that does not verify must not vouch for a repair in progress
        stale.unlink()
    copied = 0
    for rel in files:
        dst = entry / rel
        if dst.is_file() and dst.stat().st_size == (src / rel).stat().st_size and sha256_file(dst) == hashes[rel]:
            continue  # a good file from an earlier, interrupted stage
        copied += _copy_verified(src / rel, dst, hashes[rel])
    check_model(entry, files)
    manifest = {
        "version": MANIFEST_VERSION,
        "source": str(src),
        "scheme": "local",
        "revision": revision,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "total_bytes": sum((src / rel).stat().st_size for rel in files),
        "files": {rel: {"size": (src / rel).stat().st_size, "sha256": hashes[rel]} for rel in files},
        "model": meta,
    }
    _atomic_write_json(entry / MANIFEST, manifest)
    valid, reason = verify_entry(entry)
    if not valid:
        (entry / MANIFEST).unlink(missing_ok=True)
        raise StageError(f"cache entry {entry}: does not verify after copying ({reason}); check the disk and stage again")
    return StageResult(str(entry), False, copied, manifest, {**meta, "cache_hit": False})


def stage_model(source: str, cache: str, allow: list[str] | None = None, ignore: list[str] | None = None) -> StageResult:
    """Stages a model from any supported source into the cache (the component's core).

    Args:
        source: Local model folder. (`hf://`, `ms://` and `gs://` sources: not yet.)
        cache: Cache root folder.
        allow: Only stage files matching these globs. Default None.
        ignore: Skip files matching these globs. Default None.

    Returns:
        The StageResult.

    Raises:
        StageError: Unsupported scheme, or any staging failure.
    """
    scheme = source.split("://", 1)[0] if "://" in source else ""
    if scheme:
        raise StageError(
            f"model source {source!r}: scheme '{scheme}://' is not supported yet; "
            "stage it to a local folder and pass that folder"
        )
    if "://" in cache:
        raise StageError(f"model cache {cache!r}: only local cache folders are supported yet")
    return stage_local(source, cache, allow, ignore)


def result_summary(result: StageResult) -> dict[str, Any]:
    """Returns the JSON-able facts of a StageResult (for logs and artifact metadata)."""
    out = asdict(result)
    out.pop("manifest")
    out["revision"] = result.manifest.get("revision", "")
    out["source"] = result.manifest.get("source", "")
    out["total_bytes"] = result.manifest.get("total_bytes", 0)
    return out

