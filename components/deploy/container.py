"""The serving container's entry point on Vertex AI: copy the model, then `swift deploy` it.

Vertex starts a custom serving container with the model's folder in `AIP_STORAGE_URI` (a
gs:// copy Vertex made of the registered artifact) and the port to listen on in
`AIP_HTTP_PORT`; it probes the health route and forwards requests to the predict route (and,
through the endpoint's `invoke` method, to any route). This module copies the folder to local
disk, checks it is a model folder, and replaces itself with `swift deploy` on 0.0.0.0, serving
OpenAI chat on `/v1/chat/completions` and health on `/health` under the model name `tuned`.

    python3 -m components.deploy.container            # in the container (register's default command)
    python3 -m components.deploy.container --dry-run  # copy, then print the command instead of running it

Environment: AIP_STORAGE_URI (required: gs:// folder or a local folder), AIP_HTTP_PORT
(default 8080), SERVED_MODEL_NAME (default tuned), SWIFT_INFER_BACKEND (default transformers),
MODEL_DIR (where the copy goes, default /tmp/model).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from components.deploy.errors import DeployError
from components.deploy.local_server import build_deploy_command, model_type_of, trained_max_pixels

DEFAULT_MODEL_DIR = "/tmp/model"


class ModelCopyError(DeployError):
    """The model folder could not be copied from AIP_STORAGE_URI, or it is not a model folder."""


def copy_model(uri: str, dest: str | os.PathLike) -> Path:
    """Copies the model folder at `uri` (gs:// or local) to `dest`; returns `dest`.

    Raises:
        ModelCopyError: Nothing under the URI, or no config.json in what was copied.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if uri.startswith("gs://"):
        count = _copy_gcs(uri, dest)
    else:
        src = Path(uri)
        if not src.is_dir():
            raise ModelCopyError(f"AIP_STORAGE_URI {uri!r} is not a folder")
        shutil.copytree(src, dest, dirs_exist_ok=True)
        count = sum(1 for p in dest.rglob("*") if p.is_file())
    if count == 0:
        raise ModelCopyError(f"no files under {uri}: the registered artifact is empty or was deleted")
    if not (dest / "config.json").is_file():
        raise ModelCopyError(f"{uri} holds {count} files but no config.json: not a merged model folder")
    return dest


def _copy_gcs(uri: str, dest: Path) -> int:
    from components.common.storage import client, split_gs

    bucket_name, prefix = split_gs(uri.rstrip("/"))
    prefix = f"{prefix}/" if prefix else ""
    count = 0
    for blob in client().list_blobs(bucket_name, prefix=prefix):
        rel = blob.name[len(prefix) :]
        if not rel or rel.endswith("/"):
            continue
        target = (dest / rel).resolve()
        if dest.resolve() not in target.parents:
            raise ModelCopyError(f"gs://{bucket_name}/{blob.name} would be written outside {dest}")
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
        count += 1
    return count


def serving_command(model_dir: str | os.PathLike, environ: dict[str, str] | os._Environ) -> list[str]:
    """The `swift deploy` command for the copied model, from the container's environment."""
    return build_deploy_command(
        str(model_dir),
        int(environ.get("AIP_HTTP_PORT") or 8080),
        host="0.0.0.0",
        model_type=model_type_of(model_dir),
        served_model_name=environ.get("SERVED_MODEL_NAME") or "tuned",
        infer_backend=environ.get("SWIFT_INFER_BACKEND") or "transformers",
        max_pixels=trained_max_pixels(model_dir),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m components.deploy.container", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="copy the model, print the command, do not serve")
    args = parser.parse_args(argv)
    uri = os.environ.get("AIP_STORAGE_URI", "")
    if not uri:
        print("serving container: AIP_STORAGE_URI is not set (Vertex sets it to the model's folder)", file=sys.stderr)
        return 2
    try:
        model_dir = copy_model(uri, os.environ.get("MODEL_DIR") or DEFAULT_MODEL_DIR)
    except ModelCopyError as exc:
        print(f"serving container: {exc}", file=sys.stderr)
        return 1
    cmd = serving_command(model_dir, os.environ)
    print(f"serving container: {uri} copied to {model_dir}; {' '.join(cmd)}", flush=True)
    if args.dry_run:
        return 0
    from components.common.swift import swift_executable

    os.execv(swift_executable(), [swift_executable(), *cmd[1:]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
