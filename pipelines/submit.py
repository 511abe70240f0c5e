"""Submit the pipeline to Vertex AI Pipelines (`python -m pipelines.run --config F`).

`submit_vertex` checks project, region, GPU shape and buckets (`pipelines.vertex.preflight`),
prints the cost estimate, compiles the config for Vertex in a temporary folder and submits
an `aiplatform.PipelineJob` (pipeline root, labels, experiment, caching switch, service
account, network, CMEK key); it prints the console link and, with `wait`, the job's and its
tasks' states until it ends (`wait_for`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from pipelines.config import Config
from pipelines.estimate import estimate_lines
from pipelines.local_run import RunError
from pipelines.vertex import console_link, init_vertex, pipeline_job, preflight


def submit_vertex(
    cfg: Config,
    *,
    wait: bool = False,
    enable_caching: bool | None = None,
    credentials: Any = None,
    api_endpoint: str | None = None,
    poll_s: float = 30.0,
    out: Any = None,
) -> dict[str, Any]:
    """Compiles the config for Vertex and submits it as a PipelineJob.

    Args:
        cfg: The validated config (`vertex.project` and a gs:// `pipeline.root` needed).
        wait: Print the job's state until it ends. Default false.
        enable_caching: Reuse unchanged tasks; default the config's setting.
        credentials: google-auth credentials; default Application Default Credentials.
        api_endpoint: Vertex API endpoint override (tests). Default the regional endpoint.
        poll_s: Seconds between state checks with `wait`. Default 30.
        out: Stream for progress lines. Default stdout.

    Returns:
        {"name": resource name, "link": console URL, "state": last known state}.

    Raises:
        VertexError: The config cannot be submitted (missing project or bucket, ...);
            raised before anything is created.
        RunError: With `wait`, the job ended in a state other than SUCCEEDED.
    """
    import tempfile

    from kfp import compiler

    from pipelines.pipeline import build_pipeline, pipeline_arguments

    out = out or sys.stdout
    preflight(cfg, credentials)
    print("\n".join(estimate_lines(cfg)), file=out, flush=True)  # what it will cost, before anything is created
    v = cfg.vertex
    init_vertex(
        v.project,
        v.region,
        credentials=credentials,
        api_endpoint=api_endpoint,
        service_account=v.service_account or None,
        encryption_key=v.encryption_key or None,
    )
    with tempfile.TemporaryDirectory(prefix="vlm-lora-") as tmp:
        template = str(Path(tmp) / "pipeline.yaml")
        compiler.Compiler().compile(build_pipeline(cfg, "vertex"), package_path=template)
        job = pipeline_job(
            cfg, template, pipeline_arguments(cfg), enable_caching=enable_caching, credentials=credentials
        )
        job.submit(
            service_account=v.service_account or None, network=v.network or None, experiment=v.experiment or None
        )
    link = console_link(job.resource_name)
    print(f"submitted {job.resource_name}\nconsole: {link}", file=out, flush=True)
    state = job._gca_resource.state.name
    if wait:
        state = wait_for(job, poll_s, out)
        if state != "PIPELINE_STATE_SUCCEEDED":
            raise RunError(f"pipeline job {job.resource_name} ended {state}; see {link}")
    return {"name": job.resource_name, "link": link, "state": state}


def wait_for(job: Any, poll_s: float, out: Any) -> str:
    """Prints a pipeline job's state (and its tasks' states) on every change until it ends."""
    done = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}
    seen: dict[str, str] = {}
    while True:
        job._sync_gca_resource()
        resource = job._gca_resource
        state = resource.state.name
        for detail in resource.job_detail.task_details:
            if detail.task_name and seen.get(detail.task_name) != detail.state.name:
                seen[detail.task_name] = detail.state.name
                print(f"  {detail.task_name:<16} {detail.state.name}", file=out, flush=True)
        if seen.get("") != state:
            seen[""] = state
            print(f"{time.strftime('%H:%M:%S')} {state}", file=out, flush=True)
        if state in done:
            return state
        time.sleep(poll_s)
