"""Submit a JobSet and follow it to the end with the `kubernetes` Python client (what GCPC's launcher does
for a Vertex CustomJob): create it, watch it to Completed or Failed, name a failed pod's last log lines,
and delete it (pods included) when the follower is cancelled.

`follow_jobset(api_client, manifest)` takes any configured `kubernetes.client.ApiClient` (in a pod:
`in_cluster_client()`; tests: one pointed at a local server). JobSet's terminal state is its
`Completed` or `Failed` condition (jobset.x-k8s.io/v1alpha2 status.conditions, and `terminalState`
where the controller sets it).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
LOG_LINES = 40


class JobSetFailed(RuntimeError):
    """The JobSet ended Failed; the message holds its reason and the failed pod's last log lines."""


class JobSetCancelled(RuntimeError):
    """The follower was cancelled (SIGTERM / Ctrl-C) and deleted the JobSet."""


@dataclass
class Outcome:
    """How the JobSet ended.

    Attributes:
        name: JobSet name.
        state: "Completed".
        restarts: status.restarts (times JobSet restarted every node).
        seconds: Time from create to the end.
    """

    name: str
    state: str
    restarts: int
    seconds: float


def in_cluster_client() -> Any:
    """An ApiClient from the pod's service account (KFP's task pods on GKE)."""
    from kubernetes import client, config

    config.load_incluster_config()
    return client.ApiClient()


def terminal_state(obj: dict[str, Any]) -> tuple[str, str]:
    """("Completed" | "Failed" | "", the condition's message) of a JobSet object."""
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("Completed", "Failed") and str(cond.get("status")) == "True":
            return cond["type"], str(cond.get("message") or cond.get("reason") or "")
    if status.get("terminalState") in ("Completed", "Failed"):
        return status["terminalState"], ""
    return "", ""


def failed_pod_logs(api_client: Any, namespace: str, name: str, lines: int = LOG_LINES) -> tuple[str, str]:
    """(the first failed pod's name, its last `lines` log lines); ("", "") when none failed."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{NAME_LABEL}={name}").items
    failed = sorted((p for p in pods if p.status and p.status.phase == "Failed"), key=lambda p: p.metadata.name)
    if not failed:
        return "", ""
    pod = failed[0].metadata.name
    try:
        text = core.read_namespaced_pod_log(pod, namespace, tail_lines=lines)
    except client.ApiException as exc:
        text = f"(no log: {exc.status} {exc.reason})"
    return pod, text


def follow_jobset(
    api_client: Any,
    manifest: dict[str, Any],
    *,
    watch_timeout_s: int = 300,
    log: Callable[[str], None] = print,
    cancel_signals: tuple[int, ...] = (signal.SIGTERM,),
) -> Outcome:
    """Creates the JobSet (or follows the one of that name already there, or replaces it if it Failed) and waits.

    Args:
        api_client: A configured `kubernetes.client.ApiClient`.
        manifest: The JobSet (`components.common.jobset.build_jobset`).
        watch_timeout_s: Seconds one watch request lasts before it is renewed. Default 300.
        log: Where state changes are written. Default print.
        cancel_signals: Signals that cancel (the JobSet is deleted); () = none installed (a
            KeyboardInterrupt still cancels). Default SIGTERM (a cancelled pipeline run).

    Returns:
        The Outcome of a Completed JobSet.

    Raises:
        JobSetFailed: It ended Failed (reason and the failed pod's last log lines in the message).
        JobSetCancelled: Cancelled; the JobSet was deleted with its pods.
        kubernetes.client.ApiException: The API refused the create (other than "already exists").
    """
    from kubernetes import client, watch

    api = client.CustomObjectsApi(api_client)
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    started = time.monotonic()
    _create(api, manifest, log)
    previous = {s: signal.signal(s, _raise_interrupt) for s in cancel_signals}
    try:
        obj = _wait(api, watch.Watch(), ns, name, watch_timeout_s, log)
    except KeyboardInterrupt:
        api.delete_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, body=client.V1DeleteOptions(propagation_policy="Foreground")
        )
        log(f"jobset {ns}/{name}: cancelled, deleted with its pods")
        raise JobSetCancelled(f"jobset {ns}/{name} cancelled and deleted") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    state, message = terminal_state(obj)
    restarts = int((obj.get("status") or {}).get("restarts") or 0)
    if state == "Failed":
        pod, tail = failed_pod_logs(api_client, ns, name)
        where = f"; last log lines of pod {pod}:\n{tail}" if pod else " (no failed pod left to read)"
        raise JobSetFailed(f"jobset {ns}/{name} failed after {restarts} restart(s): {message}{where}")
    return Outcome(name, state, restarts, time.monotonic() - started)


def _create(api: Any, manifest: dict[str, Any], log: Callable[[str], None], wait_s: float = 120) -> None:
    """Creates the JobSet; one of that name already there is followed, unless it Failed: then it is replaced."""
    from kubernetes import client

    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
        log(f"jobset {ns}/{name}: created")
        return
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    if terminal_state(api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))[0] != "Failed":
        log(f"jobset {ns}/{name}: already exists (a retried task): following it")
        return
    log(f"jobset {ns}/{name}: a failed one of the same inputs is there: deleting it and starting anew")
    delete = client.V1DeleteOptions(propagation_policy="Foreground")
    api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body=delete)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except client.ApiException as exc:
            if exc.status == 404:
                break
            raise
        if time.monotonic() > deadline:
            raise JobSetFailed(f"jobset {ns}/{name}: the failed one was not deleted within {wait_s:.0f} s")
        time.sleep(1)
    api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
    log(f"jobset {ns}/{name}: created")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _wait(api: Any, w: Any, ns: str, name: str, timeout_s: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Watches one JobSet until a terminal condition; renews the watch when the server ends it."""
    last = ""
    while True:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        if terminal_state(obj)[0]:
            return obj
        version = obj["metadata"].get("resourceVersion", "")
        stream = w.stream(
            api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
            field_selector=f"metadata.name={name}", resource_version=version, timeout_seconds=timeout_s,
        )  # fmt: skip
        for event in stream:
            obj = event["object"]
            state, _ = terminal_state(obj)
            summary = _summary(obj)
            if summary != last:
                log(f"jobset {ns}/{name}: {summary}")
                last = summary
            if state:
                w.stop()
                return obj


def _summary(obj: dict[str, Any]) -> str:
    status = obj.get("status") or {}
    jobs = status.get("replicatedJobsStatus") or []
    counts = ", ".join(f"{j.get('name')}: {j.get('active', 0)} active, {j.get('failed', 0)} failed" for j in jobs)
    state = terminal_state(obj)[0] or ("suspended" if (obj.get("spec") or {}).get("suspend") else "running")
    return f"{state}, restarts {status.get('restarts', 0)}" + (f" ({counts})" if counts else "")
