"""Rules across keys of train-lora's Vertex CustomJob, from the API's own types and Vertex's guides.

Pure (no cloud client, no kfp): `pipelines.config` calls `job_rule_problems` when a config
loads and turns the first problem into a `ConfigError` at the key's file:line. Each rule
names where it comes from:

* boot disk per machine: `aiplatform_v1.DiskSpec` and Compute Engine's disk table
  (`pipelines.shapes.disk_types`);
* Flex Start (`Scheduling.Strategy.FLEX_START`, Dynamic Workload Scheduler): Vertex's
  "Schedule training jobs based on resource availability" guide: a job of at most 7 days,
  no reservation; `Scheduling.max_wait_duration` 0 = wait without limit;
* TensorBoard: Vertex's TensorBoard-with-custom-training guide: the upload runs as a
  service account of the user's own (`CustomJobSpec.service_account`);
* persistent resource: `CreatePersistentResourceRequest.persistent_resource_id`'s form,
  `^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`.
"""

from __future__ import annotations

import re
from typing import Any

from pipelines import shapes

FLEX_START_MAX_TIMEOUT_S = 7 * 24 * 3600  # "a maximum timeout of 7 days or less" (Vertex DWS guide)
PERSISTENT_RESOURCE_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


def job_rule_problems(cfg: Any) -> list[tuple[str, str]]:
    """Returns (key, message) for each rule the config breaks, in the order the keys are checked.

    Args:
        cfg: A `pipelines.config.Config` whose single keys already passed their own checks.

    Returns:
        [] when every rule holds; else pairs of the key to point at and a one-line message
        that says what is wrong and the fix.
    """
    r, v = cfg.resources, cfg.vertex
    problems: list[tuple[str, str]] = []
    disk = shapes.check_disk(r.machine_type, r.boot_disk_type)
    if disk:
        problems.append(("resources.boot_disk_type", f"'resources.boot_disk_type': {disk}"))
    if r.scheduling == "flex_start" and r.reservation:
        problems.append(
            (
                "resources.reservation",
                f"'resources.reservation' {r.reservation!r} with 'resources.scheduling: flex_start': Flex Start "
                "(Dynamic Workload Scheduler) does not use reservations; remove resources.reservation, or use "
                "scheduling: standard to run on the reservation",
            )
        )
    if r.scheduling == "flex_start" and r.timeout_s > FLEX_START_MAX_TIMEOUT_S:
        problems.append(
            (
                "resources.timeout_s",
                f"'resources.timeout_s' {r.timeout_s} with 'resources.scheduling: flex_start': Flex Start jobs run "
                f"at most 7 days; set resources.timeout_s to at most {FLEX_START_MAX_TIMEOUT_S}",
            )
        )
    if v.tensorboard and not v.service_account:
        problems.append(
            (
                "vertex.tensorboard",
                "'vertex.tensorboard' is set but 'vertex.service_account' is empty: Vertex uploads train-lora's "
                "TensorBoard logs only as a service account of your own; set vertex.service_account "
                "(NAME@PROJECT.iam.gserviceaccount.com, with roles/aiplatform.user and storage access) "
                "or remove vertex.tensorboard",
            )
        )
    pr = v.persistent_resource_id
    if pr and not PERSISTENT_RESOURCE_ID.match(pr):
        problems.append(
            (
                "vertex.persistent_resource_id",
                f"'vertex.persistent_resource_id' must be a persistent resource ID: a lowercase letter, then up "
                f"to 62 of a-z, 0-9 and '-', not ending in '-' (the ID, not projects/.../persistentResources/ID), "
                f"got {pr!r}",
            )
        )
    return problems
