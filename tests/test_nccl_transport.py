"""NCCL's INFO lines -> the transport and plugin it chose (components.common.preflight.nccl_transport).

The lines are NCCL 2.21-2.27's own wording, with the `host:pid:tid [dev] NCCL INFO` prefix, as
preflight's torchrun prints them on A3 Ultra / A4 (gIB, RoCE), A3 Mega (TCPXO) and a plain VPC."""

from components.common.preflight.nccl_transport import parse_nccl_log, seen

A4_GIB = """\
a4-0:412:412 [0] NCCL INFO Bootstrap : Using eth0:10.128.0.12<0>
a4-0:412:412 [0] NCCL INFO NET/Plugin: Loaded net plugin gIB (v8)
a4-0:412:412 [0] NCCL INFO NET/Plugin: Loaded collnet plugin gIB (v8)
a4-0:412:412 [0] NCCL INFO cudaDriverVersion 12080
NCCL version 2.26.6+cuda12.8
a4-0:412:412 [0] NCCL INFO NCCL version 2.26.6+cuda12.8
a4-0:412:430 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [2]mlx5_2:1/RoCE [RO]; OOB eth0:10.128.0.12<0>
a4-0:412:430 [0] NCCL INFO Using network IB
a4-0:412:430 [0] NCCL INFO GPU Direct RDMA Enabled for HCA 0 'mlx5_0'
a4-0:412:441 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
a4-0:412:441 [0] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
a4-0:412:441 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
a4-0:412:441 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
a4-0:412:441 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""

SOCKET = """\
n1:77:77 [3] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory : when loading libnccl-net.so
n1:77:77 [3] NCCL INFO NET/Plugin: Using internal network plugin.
n1:77:77 [3] NCCL INFO NCCL version 2.21.5+cuda12.4
n1:77:90 [3] NCCL INFO NET/IB : No device found.
n1:77:90 [3] NCCL INFO NET/Socket : Using [0]eth0:10.1.2.3<0>
n1:77:90 [3] NCCL INFO Using network Socket
n1:77:95 [3] NCCL INFO Channel 00/0 : 11[3] -> 3[3] [receive] via NET/Socket/0
n1:77:95 [3] NCCL INFO Channel 00/0 : 3[3] -> 11[3] [send] via NET/Socket/0
n1:77:95 [3] NCCL INFO Channel 00 : 3[3] -> 4[4] via SHM/direct/direct
"""

TCPXO = """\
a3m:50:50 [0] NCCL INFO NET/Plugin: Loaded net plugin FasTrak (v8)
a3m:50:50 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
a3m:50:61 [0] NCCL INFO Using network FasTrak
a3m:50:70 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/FasTrak/0
"""


def test_a4_with_gib_reports_rdma_on():
    t = parse_nccl_log(A4_GIB.splitlines())
    assert (t.version, t.network, t.plugin) == ("2.26.6+cuda12.8", "IB", "gIB")
    assert t.devices == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert t.paths == {"P2P/CUMEM": 2, "NET/IB/GDRDMA": 2}
    assert t.gpudirect == "RDMA"
    assert t.summary() == (
        "NCCL 2.26.6+cuda12.8: network IB, plugin gIB, devices mlx5_0, mlx5_1, mlx5_2; "
        "inter-node via NET/IB/GDRDMA; intra-node via P2P/CUMEM (GPUDirect RDMA on)"
    )


def test_sockets_without_a_plugin_report_gpudirect_off():
    t = parse_nccl_log(SOCKET.splitlines())
    assert (t.network, t.plugin, t.devices) == ("Socket", "internal", ["eth0"])
    assert t.paths == {"NET/Socket": 2, "SHM": 1}
    assert t.gpudirect == "off"
    assert "GPUDirect off: inter-node traffic is staged through host memory" in t.summary()


def test_tcpxo_on_a3_mega():
    t = parse_nccl_log(TCPXO.splitlines())
    assert (t.network, t.plugin, t.gpudirect) == ("FasTrak", "FasTrak", "GPUDirect-TCPXO")
    assert t.summary().endswith("inter-node via NET/FasTrak (GPUDirect-TCPXO on)")


def test_one_node_and_no_nccl_lines():
    one = parse_nccl_log([line for line in A4_GIB.splitlines() if "NET/IB/0" not in line and "network" not in line])
    assert one.gpudirect == "" and "network none (one node)" in one.summary()
    nothing = parse_nccl_log(["preflight: node 0/2, 8 process(es)", "gloo: all-reduce 1 MB"])
    assert not seen(nothing) and seen(one)


# Google's NCCL/gIB page (docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-vms, 2026-04-06) names these two
# lines as the sign that gIB is on; the channel lines are NCCL's own wording for a GPUDirect RDMA path.
GIB_DOCUMENTED = """\
vm-0:606:642 [6] NCCL INFO NCCL version 2.25.1+cuda12.8
vm-0:606:642 [6] NCCL INFO NET/Plugin: Loaded net plugin gIB (v9)
vm-0:606:642 [6] NCCL INFO NET/gIB : Initializing gIB v1.0.5
vm-0:606:642 [6] NCCL INFO Using network gIB
vm-0:606:650 [6] NCCL INFO Channel 00/0 : 6[6] -> 14[6] [send] via NET/gIB/6/GDRDMA
vm-0:606:650 [6] NCCL INFO Channel 01/0 : 6[6] -> 14[6] [send] via NET/gIB/6/GDRDMA
vm-0:606:650 [6] NCCL INFO Channel 00/0 : 6[6] -> 7[7] via P2P/CUMEM/read
"""


def test_the_transport_in_use_is_the_inter_node_path_most_channels_take():
    gib = parse_nccl_log(GIB_DOCUMENTED.splitlines())
    assert (gib.network, gib.plugin, gib.transport, gib.gpudirect) == ("gIB", "gIB", "NET/gIB/GDRDMA", "RDMA")
    assert parse_nccl_log(A4_GIB.splitlines()).transport == "NET/IB/GDRDMA"
    assert parse_nccl_log(SOCKET.splitlines()).transport == "NET/Socket"
    assert parse_nccl_log(TCPXO.splitlines()).transport == "NET/FasTrak"
    no_channels = parse_nccl_log([line for line in TCPXO.splitlines() if "Channel" not in line])
    assert no_channels.transport == "NET/FasTrak", "the network NCCL chose when no channel line was printed"
    assert parse_nccl_log([]).transport == ""


def test_the_report_says_what_nccl_used_and_warns_when_the_pod_was_set_up_for_another():
    from components.common import gpudirect
    from components.common.preflight.launch import nccl_figures

    logged: list[str] = []
    fell_back = nccl_figures(parse_nccl_log(SOCKET.splitlines()), gpudirect.TCPXO_ENV, logged.append)
    assert fell_back == {
        "version": "2.21.5+cuda12.4", "network": "Socket", "plugin": "internal", "transport": "NET/Socket",
        "gpudirect": "off", "expected": "FasTrak",
    }  # fmt: skip
    assert logged == [
        "preflight: WARNING: the pod is set up for NCCL network FasTrak but NCCL used Socket (NET/Socket): is the "
        "GPUDirect plugin installed on the node (docs/gke.md, GPUDirect)?"
    ]
    logged.clear()
    for lines, env in ((GIB_DOCUMENTED, gpudirect.GIB_ENV), (A4_GIB, gpudirect.GIB_ENV), (TCPXO, gpudirect.TCPXO_ENV)):
        figures = nccl_figures(parse_nccl_log(lines.splitlines()), env, logged.append)
        assert figures["expected"] in ("gIB", "FasTrak") and figures["gpudirect"] in ("RDMA", "GPUDirect-TCPXO")
    plain = nccl_figures(parse_nccl_log(SOCKET.splitlines()), {"PATH": "/usr/bin"}, logged.append)
    assert plain["expected"] == "" and logged == [], "no warning where nothing was set up, or what was set up ran"
