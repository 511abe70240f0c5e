"""GPUDirect on GKE's A3 Mega, A3 Ultra and A4 nodes: what a training pod needs, as data (pure, no client).

What GKE documents for a workload pod (read 2026-12-02; nothing here ran on these machines):

* A3 Mega (`a3-megagpu-8g`), GPUDirect-TCPXO (NCCL's network `FasTrak`):
  https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx and Google's manifests
  and release notes in GoogleCloudPlatform/container-engine-accelerators, `gpudirect-tcpxo/`
  (`nccl-test-latest.yaml`, `best-practice.md`, `README.md` release of Jan 9, 2026: plugin installer
  `nccl-plugin-gpudirecttcpx-dev:v1.0.15`, daemon `tcpgpudmarxd-dev:v1.0.21`, NCCL 2.28.7). The pod runs
  the receive-data-path daemon `tcpxo-daemon` beside the training container (a native sidecar:
  an init container with `restartPolicy: Always`, so it ends with the pod, `best-practice.md`), gives
  it the GPUs through the `devices.gke.io/container.tcpxo-daemon` annotation, asks for the eight GPU
  NICs with `networking.gke.io/interfaces`, mounts the plugin the `nccl-tcpxo-installer` DaemonSet
  puts in `/home/kubernetes/bin/nvidia/lib64` and `/dev/aperture_devices`, and sets the release's NCCL
  configuration (`TCPXO_ENV`).
* A3 Ultra (`a3-ultragpu-8g`) and A4 (`a4-highgpu-8g`), GPUDirect RDMA over RoCE through the gIB plugin
  (NCCL's network `gIB`): https://cloud.google.com/ai-hypercomputer/docs/create/gke-ai-hypercompute-custom
  (Configure Pod manifests for RDMA), https://docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-vms
  (last updated 2026-04-06: source `/usr/local/gib/scripts/set_nccl_env.sh`, `/usr/local/gib/lib64` in
  `LD_LIBRARY_PATH`; "Google expects to update them in future NCCL/gIB releases", so the script is
  sourced rather than its values copied) and `gpudirect-rdma/nccl-test-a4-autopilot.yaml` (installer
  `nccl-plugin-gib:v1.1.1`). The pod asks for `gvnic-1` and the eight `rdma-N` networks and mounts
  `/home/kubernetes/bin/nvidia` and `/home/kubernetes/bin/gib` (the `nccl-rdma-installer` DaemonSet's).
  No `rdma` resource: that is the managed-DRANET path (a ResourceClaim of `mrdma.google.com`), which
  this layout does not use.

The cluster side (the GPU NICs' `Network` / `GKENetworkParamSet` objects and the installer
DaemonSet) is the cluster's and docs/gke.md lists it; only the pod's part is written here. It is
added on more than one node only (one node has no inter-node traffic) and needs every GPU of the
node (the daemon and the RDMA networks are per node, all or nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MODES = ("auto", "require", "skip")  # not on / off: YAML 1.1 reads those as booleans
DEFAULT_INTERFACE_ANNOTATION = "networking.gke.io/default-interface"
INTERFACES_ANNOTATION = "networking.gke.io/interfaces"
TCPXO_DEVICES_ANNOTATION = "devices.gke.io/container.tcpxo-daemon"
TCPXO_DAEMON_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21"
NVIDIA_LIB = "/usr/local/nvidia/lib64"

# The Jan 9, 2026 release's "NCCL configs" (gpudirect-tcpxo/README.md), with the library folder the pod
# mounts; left out: NCCL_DEBUG / NCCL_DEBUG_SUBSYS (preflight sets them for its probe, `environment`
# for training) and CUDA_VISIBLE_DEVICES (the device plugin already gives the pod its 8 GPUs).
TCPXO_ENV: dict[str, str] = {
    "LD_LIBRARY_PATH": NVIDIA_LIB,
    "NCCL_LIB_DIR": NVIDIA_LIB,
    "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
    "NCCL_FASTRAK_CTRL_DEV": "eth0",
    "NCCL_FASTRAK_IFNAME": "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_CROSS_NIC": "0",
    "NCCL_PROTO": "Simple,LL128",
    "NCCL_MIN_NCHANNELS": "4",
    "NCCL_TUNER_PLUGIN": "libnccl-tuner.so",
    "NCCL_TUNER_CONFIG_PATH": f"{NVIDIA_LIB}/a3plus_tuner_config.textproto",
    "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": f"{NVIDIA_LIB}/a3plus_guest_config.textproto",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE": "131072",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_P2P_PCI_CHUNKSIZE": "524288",
    "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
    "NCCL_FASTRAK_NUM_FLOWS": "2",
    "NCCL_FASTRAK_USE_SNAP": "1",
    "NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS": "600000",
    "NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL": "0",
    "NCCL_BUFFSIZE": "8388608",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING": "0",
    "NCCL_FASTRAK_USE_LLCM": "1",
    "NCCL_NVLS_ENABLE": "1",
}
GIB_SCRIPT = "/usr/local/gib/scripts/set_nccl_env.sh"
# NCCL_NET=gIB: NCCL fails loudly instead of falling back to sockets when the plugin is missing.
GIB_ENV: dict[str, str] = {"LD_LIBRARY_PATH": f"/usr/local/gib/lib64:{NVIDIA_LIB}", "NCCL_NET": "gIB"}
# The training command runs after the script (`bash -c '... exec "$0" "$@"' python3 -m ...`): the
# container's args stay the program's, so `jobset.with_run` still sets only them.
GIB_PREFIX = [
    "/bin/bash",
    "-c",
    f'source {GIB_SCRIPT} || {{ echo "gIB: {GIB_SCRIPT} is missing: is the nccl-rdma-installer DaemonSet on '
    'this node? (docs/gke.md, GPUDirect)" >&2; exit 1; }; exec "$0" "$@"',
]


def _host(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path}}


@dataclass(frozen=True)
class GpuDirect:
    """What one machine type's pods need for GPUDirect (GKE's documented pod settings).

    Attributes:
        name: The stack, e.g. "GPUDirect-TCPXO".
        nccl_network: NCCL's name of its network ("FasTrak", "gIB"), as preflight reads it in NCCL's log.
        networks: GKE Network names of the GPU NICs, attached as eth1, eth2, ... in this order.
        env: The training container's environment.
        volumes: The pod's volumes (hostPath).
        mounts: The training container's mounts of them.
        command_prefix: Put before the training command ([] = none).
        daemon: The sidecar container (None = none).
        annotations: Pod annotations besides the interfaces.
    """

    name: str
    nccl_network: str
    networks: tuple[str, ...]
    env: dict[str, str]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    command_prefix: list[str] = field(default_factory=list)
    daemon: dict[str, Any] | None = None
    annotations: dict[str, str] = field(default_factory=dict)


def _tcpxo_daemon() -> dict[str, Any]:
    """The receive-data-path daemon as a native sidecar, with the startup probe of best-practice.md."""
    return {
        "name": "tcpxo-daemon",
        "image": TCPXO_DAEMON_IMAGE,
        "imagePullPolicy": "Always",
        "restartPolicy": "Always",
        "command": ["/bin/sh", "-c"],
        "args": ["set -ex\nchmod 755 /fts/entrypoint_rxdm_container.sh\n/fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics=8\n"],
        "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_BIND_SERVICE"]}},
        "env": [{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB}, {"name": "HEALTH_CHECK_LOG_FILE", "value": "/run/health-check"}],
        "volumeMounts": [
            {"name": "nvidia", "mountPath": NVIDIA_LIB},
            {"name": "sys", "mountPath": "/hostsysfs"},
            {"name": "proc-sys", "mountPath": "/hostprocsysfs"},
        ],
        "startupProbe": {
            "exec": {"command": ["cat", "/run/health-check"]},
            "initialDelaySeconds": 1, "periodSeconds": 5, "timeoutSeconds": 1, "failureThreshold": 12,
        },
    }  # fmt: skip


_TCPXO_DEVICES = [f"/dev/nvidia{i}" for i in range(8)] + [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/dmabuf_import_helper",
]
TCPXO = GpuDirect(
    name="GPUDirect-TCPXO",
    nccl_network="FasTrak",
    networks=tuple(f"vpc{i}" for i in range(1, 9)),
    env=TCPXO_ENV,
    volumes=[
        _host("nvidia", "/home/kubernetes/bin/nvidia/lib64"),
        _host("sys", "/sys"),
        _host("proc-sys", "/proc/sys"),
        _host("aperture-devices", "/dev/aperture_devices"),
    ],
    mounts=[
        {"name": "nvidia", "mountPath": NVIDIA_LIB},
        {"name": "aperture-devices", "mountPath": "/dev/aperture_devices"},
    ],
    daemon=_tcpxo_daemon(),
    annotations={TCPXO_DEVICES_ANNOTATION: "".join(f"- path: {d}\n" for d in _TCPXO_DEVICES)},
)
RDMA = GpuDirect(
    name="GPUDirect-RDMA",
    nccl_network="gIB",
    networks=("gvnic-1", *(f"rdma-{i}" for i in range(8))),
    env=GIB_ENV,
    volumes=[_host("library-dir-host", "/home/kubernetes/bin/nvidia"), _host("gib", "/home/kubernetes/bin/gib")],
    mounts=[
        {"name": "library-dir-host", "mountPath": "/usr/local/nvidia", "readOnly": True},
        {"name": "gib", "mountPath": "/usr/local/gib", "readOnly": True},
    ],
    command_prefix=GIB_PREFIX,
)
# Machine type -> its stack; every other machine (g2, a2, a3-highgpu-*) gets nothing.
MACHINES: dict[str, GpuDirect] = {"a3-megagpu-8g": TCPXO, "a3-ultragpu-8g": RDMA, "a4-highgpu-8g": RDMA}


def for_machine(machine_type: str, mode: str, nnodes: int) -> GpuDirect | None:
    """The stack a JobSet on this machine gets: on more than one node (or mode "require"), none with "skip"."""
    if mode == "skip" or (mode == "auto" and nnodes < 2):
        return None
    return MACHINES.get(machine_type)


def interfaces(networks: tuple[str, ...] | list[str]) -> str:
    """The `networking.gke.io/interfaces` value: eth0 on the default network, then eth1.. on `networks`."""
    rows = [{"interfaceName": "eth0", "network": "default"}]
    rows += [{"interfaceName": f"eth{i}", "network": n} for i, n in enumerate(networks, start=1)]
    return json.dumps(rows)


def add_to_pod(template: dict[str, Any], stack: GpuDirect, networks: tuple[str, ...] | list[str] = ()) -> None:
    """Adds a stack's annotations, sidecar, volumes, mounts, environment and command prefix to a pod template.

    Args:
        template: The pod template ({"metadata": {...}, "spec": {...}}), changed in place; its first
            container is the training one.
        stack: What to add (`MACHINES`).
        networks: The GPU NICs' GKE Network names; () = the stack's documented ones.
    """
    annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[DEFAULT_INTERFACE_ANNOTATION] = "eth0"
    annotations[INTERFACES_ANNOTATION] = interfaces(tuple(networks) or stack.networks)
    annotations.update(stack.annotations)
    pod = template["spec"]
    container = pod["containers"][0]
    if stack.daemon is not None:
        pod.setdefault("initContainers", []).append(json.loads(json.dumps(stack.daemon)))
    pod.setdefault("volumes", []).extend(json.loads(json.dumps(stack.volumes)))
    container.setdefault("volumeMounts", []).extend(json.loads(json.dumps(stack.mounts)))
    named = {e["name"] for e in container.get("env", [])}
    container.setdefault("env", []).extend({"name": k, "value": v} for k, v in stack.env.items() if k not in named)
    container["command"] = [*stack.command_prefix, *container["command"]]
