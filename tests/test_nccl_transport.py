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
