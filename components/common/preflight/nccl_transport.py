"""Which transport and network plugin NCCL chose, read from its `NCCL_DEBUG=INFO` lines (pure, no torch).

Preflight runs its all-reduces with `NCCL_DEBUG=INFO` and `NCCL_DEBUG_SUBSYS=INIT,NET` (unless the job
environment sets NCCL_DEBUG itself) and reports one line, so a user sees whether GPUDirect is on:

    preflight: NCCL 2.21.5: network IB, plugin gIB, devices mlx5_0, mlx5_1; inter-node via NET/IB/GDRDMA (GPUDirect RDMA on)

The lines NCCL writes (2.18-2.27), each after a `host:pid:tid [dev] NCCL INFO ` prefix:

* `NCCL version 2.21.5+cuda12.4`
* `NET/Plugin: Loaded net plugin gIB (v8)` / `NET/Plugin: Using internal network plugin.` /
  `NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file ...`
* `Using network IB` / `Using network gIB` (RDMA: A3 Ultra, A4 through gIB; Google's NCCL/gIB page shows
  `Using network gIB` and `NET/gIB : Initializing gIB v1.0.5`), `Using network FasTrak` (GPUDirect-TCPXO,
  A3 Mega), `Using network GPUDirectTCPX` (TCPX, A3 High), `Using network Socket` (plain TCP)
* `NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.2<0>`, `NET/Socket : Using [0]eth0:10.1.2.3<0>`
* `Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`, `... via P2P/CUMEM/read`, `... via SHM/direct/direct`

The report's `transport` is the inter-node path most channels take (`NET/gIB/GDRDMA`, `NET/FasTrak`,
`NET/Socket`), and `expected` the network the pod's environment sets up (`expected_network`: the JobSet's
GPUDirect settings, `components.common.gpudirect`); a pod set up for one that NCCL did not use is
logged as a warning (`mismatch`), e.g. TCPXO's variables without the plugin, where NCCL quietly uses sockets.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_INFO = re.compile(r"NCCL INFO (?P<msg>.*)$")
_VERSION = re.compile(r"^NCCL version (?P<v>[\w.+-]+)")
_PLUGIN = re.compile(r"^NET/Plugin\s*:\s*(?:Loaded net plugin|Loaded collnet plugin)\s+(?P<name>.+?)\s*(?:\(v\d+\))?$")
_INTERNAL = re.compile(r"^NET/Plugin\s*:\s*(?:Using internal network plugin|Plugin load returned|No plugin found)")
_NETWORK = re.compile(r"^Using network (?P<net>\S+)")
_DEVICES = re.compile(r"^NET/(?P<net>\w+)\s*:\s*Using (?P<devs>(?:\[\d+\]\S+\s*)+)")
_DEVICE = re.compile(r"\[\d+\]([^\s:<]+)")
_CHANNEL = re.compile(r"^Channel \d+(?:/\d+)? : \d+\[\d+\] -> \d+\[\d+\](?: \[\w+\])? via (?P<via>\S+)")
# Networks that move GPU memory without a host copy, by NCCL's name for them.
GPUDIRECT_NETWORKS = {"FasTrak": "GPUDirect-TCPXO", "GPUDirectTCPX": "GPUDirect-TCPX"}
# Networks that are one stack under two names (gIB drives the RDMA NICs through NCCL's IB code).
_SAME_NETWORK = {"gIB": {"gIB", "IB"}}


@dataclass
class NcclTransport:
    """What NCCL chose, as read from its INFO lines.

    Attributes:
        version: NCCL's version ("" when no line said it).
        network: NCCL's network ("IB", "Socket", "FasTrak", ...; "" = none seen, e.g. one node).
        plugin: The external net plugin NCCL loaded, "internal" when it uses its own, "" = not said.
        devices: Network devices NCCL uses (mlx5_0, eth0, ...).
        paths: How many channels go each way, e.g. {"NET/IB/GDRDMA": 16, "P2P/CUMEM": 56}.
    """

    version: str = ""
    network: str = ""
    plugin: str = ""
    devices: list[str] = field(default_factory=list)
    paths: Counter = field(default_factory=Counter)

    @property
    def gpudirect(self) -> str:
        """ "RDMA", "GPUDirect-TCPXO" / "GPUDirect-TCPX", "off" (host-staged), or "" (no inter-node channel)."""
        net = [p for p in self.paths if p.startswith("NET/")]
        if any(p.endswith("/GDRDMA") for p in net):
            return "RDMA"
        if self.network in GPUDIRECT_NETWORKS and (net or not self.paths):
            return GPUDIRECT_NETWORKS[self.network]
        return "off" if net or self.network == "Socket" else ""

    @property
    def transport(self) -> str:
        """The inter-node path most channels take ("NET/gIB/GDRDMA"), else "NET/<network>", "" = none seen."""
        net = Counter({p: n for p, n in self.paths.items() if p.startswith("NET/")})
        if net:
            return net.most_common(1)[0][0]
        return f"NET/{self.network}" if self.network else ""

    def summary(self) -> str:
        """One line for the log, e.g. `NCCL 2.21.5: network IB, plugin gIB, ...; inter-node via NET/IB/GDRDMA`."""
        parts = [f"network {self.network or 'none (one node)'}"]
        if self.plugin:
            parts.append(f"plugin {self.plugin}")
        if self.devices:
            parts.append("devices " + ", ".join(self.devices))
        net = sorted(p for p in self.paths if p.startswith("NET/"))
        local = sorted(p for p in self.paths if not p.startswith("NET/"))
        text = f"NCCL {self.version or '?'}: " + ", ".join(parts)
        if net:
            text += "; inter-node via " + ", ".join(net)
        if local:
            text += "; intra-node via " + ", ".join(local)
        state = self.gpudirect
        if state == "off":
            text += " (GPUDirect off: inter-node traffic is staged through host memory; docs/vertex.md, GPUDirect)"
        elif state:
            text += f" (GPUDirect {state} on)" if state == "RDMA" else f" ({state} on)"
        return text


def _path(via: str) -> str:
    """`NET/IB/0/GDRDMA` -> `NET/IB/GDRDMA`; `P2P/CUMEM/read` -> `P2P/CUMEM`; `SHM/direct/direct` -> `SHM`."""
    parts = via.split("/")
    if parts[0] == "NET":
        kept = [p for p in parts[:2]] + [p for p in parts[2:] if not p.isdigit()]
        return "/".join(kept)
    if parts[0] == "P2P":
        return "/".join(parts[:2])
    return parts[0]


def parse_nccl_log(lines: Iterable[str]) -> NcclTransport:
    """Reads NCCL's INFO lines (others are ignored) into an `NcclTransport`.

    Args:
        lines: Output lines of the processes that ran NCCL, in any order, any ranks.

    Returns:
        What NCCL chose; every field empty when no NCCL INFO line was among them.
    """
    out = NcclTransport()
    for raw in lines:
        m = _INFO.search(raw.rstrip())
        if not m:
            continue
        msg = m.group("msg").strip()
        if v := _VERSION.match(msg):
            out.version = out.version or v.group("v")
        elif p := _PLUGIN.match(msg):
            out.plugin = p.group("name")
        elif _INTERNAL.match(msg) and not out.plugin:
            out.plugin = "internal"
        elif n := _NETWORK.match(msg):
            out.network = n.group("net")
        elif d := _DEVICES.match(msg):
            for dev in _DEVICE.findall(d.group("devs")):
                if dev not in out.devices:
                    out.devices.append(dev)
        elif c := _CHANNEL.match(msg):
            out.paths[_path(c.group("via"))] += 1
    return out


def seen(transport: NcclTransport) -> bool:
    """Whether any NCCL INFO line was read."""
    return bool(transport.version or transport.network or transport.plugin or transport.paths)


def expected_network(env: Mapping[str, str]) -> str:
    """The NCCL network a pod's environment sets up: "FasTrak" (TCPXO's variables), NCCL_NET's value, or ""."""
    if any(k.startswith("NCCL_FASTRAK_") for k in env):
        return "FasTrak"
    return env.get("NCCL_NET", "")


def mismatch(transport: NcclTransport, expected: str) -> str:
    """A warning when NCCL used another network than the environment set up ("" = none, or nothing to compare).

    Args:
        transport: What NCCL's lines said.
        expected: `expected_network` of the environment.

    Returns:
        One line naming both, or "" (no expectation, no network seen: one node, or the same network).
    """
    if not expected or not transport.network or transport.network in _SAME_NETWORK.get(expected, {expected}):
        return ""
    return (
        f"the pod is set up for NCCL network {expected} but NCCL used {transport.network} "
        f"({transport.transport or 'no inter-node channel'}): is the GPUDirect plugin installed on the node "
        "(docs/gke.md, GPUDirect)?"
    )
