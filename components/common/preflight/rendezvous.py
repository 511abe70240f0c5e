"""Who this rank is (`_identity`) and the rendezvous of every rank, bounded in time (`rendezvous`).

Part of the preflight (`components.common.preflight`, its docstring says what it checks and why).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from components.common.preflight.expectations import NCCL_KNOBS, PreflightFailed, RendezvousTimeout
from components.common.preflight.options import Options

# --- rendezvous ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Identity:
    """Who this process is in the preflight job."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node_rank: int
    nnodes: int
    hostname: str
    master_addr: str
    master_port: int
    agent_store: bool = False  # under torchrun: use the agent's store (it listens on MASTER_PORT)
    prefix: str = "preflight/"
    hosts: tuple[str, ...] = ()


def _identity(opts: Options, environ: Mapping[str, str]) -> _Identity:
    """This process's rank, node and rendezvous address, from the options (--launch) or torchrun's variables."""
    host = socket.gethostname()
    local_rank = int(environ.get("LOCAL_RANK", 0))
    local_world = int(environ.get("LOCAL_WORLD_SIZE", 1))
    if opts.nnodes:  # started by --launch: torchrun --standalone on this node, our own cross-node rendezvous
        rank = opts.node_rank * local_world + local_rank
        return _Identity(
            rank,
            opts.nnodes * local_world,
            local_rank,
            local_world,
            opts.node_rank,
            opts.nnodes,
            host,
            opts.master_addr,
            opts.master_port,
            hosts=tuple(opts.hosts),
        )
    if "RANK" in environ:  # under torchrun, started by the user
        rank, world = int(environ["RANK"]), int(environ.get("WORLD_SIZE", 1))
        local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
        run = f"preflight/{environ.get('TORCHELASTIC_RUN_ID', 'run')}/{environ.get('TORCHELASTIC_RESTART_COUNT', 0)}/"
        return _Identity(
            rank,
            world,
            local_rank,
            local_world,
            int(environ.get("GROUP_RANK", rank // max(local_world, 1))),
            max(1, world // max(local_world, 1)),
            host,
            environ.get("MASTER_ADDR", "127.0.0.1"),
            int(environ.get("MASTER_PORT", 0)),
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            prefix=run,
        )
    return _Identity(0, 1, 0, 1, 0, 1, host, "127.0.0.1", 0)


def _first_line(exc: BaseException) -> str:
    """The first line of an error from torch's C++ side (the rest is a C++ stack trace)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _rank_place(me: _Identity, rank: int) -> str:
    """'rank 5 (node 1, host-b)': where a rank runs when the ranks are node-major."""
    node = rank // max(me.local_world, 1)
    host = f", {me.hosts[node]}" if node < len(me.hosts) else ""
    return f"rank {rank} (node {node}{host})"


def _wait_reachable(me: _Identity, deadline: float) -> None:
    """Waits until rank 0's store accepts connections (a plain socket: no C++ stack traces in the log)."""
    while True:
        try:
            with socket.create_connection((me.master_addr, me.master_port), timeout=2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"{_rank_place(me, me.rank)} could not reach rank 0's rendezvous at {me.master_addr}:"
                    f"{me.master_port} ({exc.strerror or exc}): node 0 did not start its preflight, or the "
                    f"address/port is blocked between the nodes. {NCCL_KNOBS}"
                ) from None
            time.sleep(0.5)


def rendezvous(me: _Identity, timeout_s: float) -> Any:
    """Meets every rank at rank 0's TCPStore, waiting at most `timeout_s` seconds.

    Each rank sets a key; rank 0 waits for all keys and names the ranks whose key is
    missing when time runs out (and tells the others); the other ranks give up too.

    Args:
        me: This process.
        timeout_s: Longest wait for all ranks, seconds.

    Returns:
        The store (a PrefixStore), ready for init_process_group.

    Raises:
        RendezvousTimeout: A rank did not join, or rank 0 could not be reached.
    """
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    hosting = me.rank == 0 and not me.agent_store
    if not hosting:
        _wait_reachable(me, deadline)
    try:
        store = dist.TCPStore(
            me.master_addr,
            me.master_port,
            is_master=hosting,
            timeout=timedelta(seconds=max(timeout_s, 10)),
            wait_for_workers=False,
        )
    except RuntimeError as exc:  # the port is taken (rank 0), or the store went away
        raise PreflightFailed(
            f"{_rank_place(me, me.rank)}: the rendezvous store at {me.master_addr}:{me.master_port} failed: "
            f"{_first_line(exc)}; is another preflight or job using that port?"
        ) from None
    store = dist.PrefixStore(me.prefix, store)
    store.set(f"joined/{me.rank}", json.dumps({"node": me.node_rank, "host": me.hostname}))
    while True:
        if me.rank == 0:
            missing = [r for r in range(me.world) if not store.check([f"joined/{r}"])]
            if not missing:
                store.set("go", "1")
                return store
        elif store.check(["go"]):
            return store
        elif store.check(["abort"]):
            raise RendezvousTimeout(store.get("abort").decode())
        if time.monotonic() > deadline + (0 if me.rank == 0 else 5):
            break
        time.sleep(0.2)
    if me.rank != 0:
        raise RendezvousTimeout(f"{_rank_place(me, me.rank)}: rank 0 did not see every rank within {timeout_s:g} s")
    message = (
        f"{len(missing)} of {me.world} rank(s) did not join the preflight within {timeout_s:g} s: "
        f"{', '.join(_rank_place(me, r) for r in missing)}. That node did not start (Vertex still provisioning "
        f"it, a crash before the preflight: read its log), or cannot reach {me.master_addr}:{me.master_port}"
    )
    store.set("abort", message)
    time.sleep(1.0)  # let the others read it before this store goes away
    raise RendezvousTimeout(message)
