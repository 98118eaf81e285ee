"""spina/netns.py: the namespace primitives every test, bench and testbed network is built from.

Run just this file: python -m pytest tests/test_netns_primitives.py   (real namespaces: root)
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from spina import netns
from tests.waits import until

TAG = netns.unique_tag("snp")


def test_command_runs_in_a_named_namespace_a_process_s_or_here():
    """A name goes through `ip netns exec`, a pid through nsenter, None runs here."""
    assert netns.command("a", "sysctl", "-qw", 1) == ["ip", "netns", "exec", "a", "sysctl",
                                                       "-qw", "1"]
    assert netns.command(42, "ip", "addr") == ["nsenter", "--net=/proc/42/ns/net", "ip", "addr"]
    assert netns.command(None, "true") == ["true"]
    assert TAG == f"snp{os.getpid() % 100000}"


@pytest.fixture
def root():
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(why)
    with netns.removing_leftovers(TAG) as left:
        yield
    assert left == [], f"namespaces left behind: {left}"


def _link(ns, ifc):
    return json.loads(netns.ip("-j", "addr", "show", "dev", ifc, ns=ns).stdout)[0]


def _interfaces(ns, conn):
    netns.enter(ns)
    with open("/proc/thread-self/net/dev") as f:
        conn.send(sorted(ln.split(":")[0].strip() for ln in f.readlines()[2:]))


def test_a_veth_between_two_namespaces_has_its_addresses_mtu_and_tbf(root):
    """Both ends land in their namespaces with the MTU, address, static ARP and tbf asked for;
    a child process that enters one sees exactly its interfaces; close() leaves nothing."""
    a, b = f"{TAG}-a", f"{TAG}-b"
    with netns.Network() as net:
        net.namespace(a)
        net.namespace(b)
        net.veth("x0", "y0", a_ns=a, b_ns=b, mtu=1400)
        netns.set_link("x0", a, address="02:00:00:00:0a:01")
        netns.add_addr("x0", "10.231.0.1/24", a)
        netns.static_arp("x0", "10.231.0.2", "02:00:00:00:0b:01", a)
        netns.tbf("x0", "100mbit", 131072, 20, a)
        info = _link(a, "x0")
        assert (info["mtu"], info["address"], "UP" in info["flags"]) == (
            1400, "02:00:00:00:0a:01", True)
        assert [(x["local"], x["prefixlen"]) for x in info["addr_info"]] == [("10.231.0.1", 24)]
        assert _link(b, "y0")["mtu"] == 1400
        neigh = json.loads(netns.ip("-j", "neigh", "show", "dev", "x0", ns=a).stdout)
        assert [(n["dst"], n["lladdr"], n["state"]) for n in neigh] == [
            ("10.231.0.2", "02:00:00:00:0b:01", ["PERMANENT"])]
        q = json.loads(netns.tc("-j", "qdisc", "show", "dev", "x0", ns=a).stdout)[0]
        assert (q["kind"], q["options"]["rate"]) == ("tbf", 12_500_000)  # bytes/s
        # the kernel keeps the bucket in clock ticks at the rate: 131072 reads back 131062
        assert abs(q["options"]["burst"] - 131072) < 16
        assert netns.qdisc_drops("x0", a) == 0
        assert netns.in_ns(b, "sysctl", "-n", "net.ipv6.conf.all.disable_ipv6").stdout == "1\n"
        parent, child = mp.Pipe()
        p = mp.get_context("fork").Process(target=_interfaces, args=(b, child))
        p.start()
        assert parent.recv() == ["lo", "y0"]
        p.join()
    assert netns.leftover_namespaces(TAG) == []


def test_a_failed_build_removes_its_namespaces_and_root_links(root):
    """An exception part way through `building()` removes the namespaces and the root end of
    a veth whose other end is in a namespace not ours (a process's, as mininet's hosts)."""
    net = netns.Network()
    sleeper = None
    with pytest.raises(subprocess.CalledProcessError):
        with net.building():
            net.namespace(f"{TAG}-c")
            sleeper = subprocess.Popen(["unshare", "--net", "sleep", "30"])
            _wait_unshared(sleeper)
            net.veth(f"{TAG}r", "m0", b_ns=sleeper.pid)
            assert netns.ip("link", "show", f"{TAG}r").returncode == 0  # made, in the root
            net.veth(f"{TAG}q", "m1", b_ns=f"{TAG}-missing")  # fails: no such namespace
    try:
        assert netns.leftover_namespaces(TAG) == []
        assert netns.ip("link", "show", f"{TAG}r", check=False).returncode != 0
        assert net.namespaces == [] and net.links == []
    finally:
        sleeper.kill()
        sleeper.wait()


def _wait_unshared(proc) -> None:
    """Until `proc` is in a network namespace other than ours."""
    mine = os.readlink("/proc/self/ns/net")
    until(lambda: os.readlink(f"/proc/{proc.pid}/ns/net") != mine,
          "unshare --net to give the process its own namespace", 10)


_TERMED = """
import multiprocessing as mp, signal, sys, time
from spina import netns
tag = sys.argv[1]
def child(conn):
    conn.send(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)
    time.sleep(30)
with netns.Network() as net:
    net.namespace(tag + "-t0")
    net.namespace(tag + "-t1")
    there, mine = mp.Pipe()
    kid = mp.get_context("fork").Process(target=child, args=(mine,))
    kid.start()
    assert there.recv()  # the child inherited the handler
    print(kid.pid, flush=True)
    time.sleep(30)
"""


def test_sigterm_removes_the_namespaces_of_the_process_that_made_them(root):
    """A bench stopped by `timeout` (SIGTERM) removes what it made: the `with` block unwinds
    (exit 143); a forked child that inherited the handler dies of SIGTERM as before; and
    after the last Network closes, SIGTERM's handler is the default again."""
    proc = subprocess.Popen([sys.executable, "-c", _TERMED, TAG], stdout=subprocess.PIPE,
                            text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    kid = int(proc.stdout.readline())
    assert sorted(netns.leftover_namespaces(TAG)) == [f"{TAG}-t0", f"{TAG}-t1"]
    os.kill(kid, signal.SIGTERM)
    until(lambda: _gone(kid), f"process {kid} to end on SIGTERM", 10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    assert netns.leftover_namespaces(TAG) == []
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever an earlier test left
    try:
        with netns.Network() as net:
            net.namespace(f"{TAG}-t2")
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        def own(*_):  # a handler of the caller's own is left alone
            pass
        signal.signal(signal.SIGTERM, own)
        with netns.Network() as net:
            net.namespace(f"{TAG}-t3")
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, before)


def _gone(pid: int) -> bool:
    """Process `pid` (not our child) has exited or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_packet_socket_receives_its_interface_s_frames_only(root):
    """packet_socket(y1) takes the frame that arrives on y1 and not the one sent at the same
    time over another veth pair (it never listens on every interface, not even before bind)."""
    x1, y1, x2, y2 = (f"{TAG}{n}" for n in ("x1", "y1", "x2", "y2"))
    with netns.Network() as net:
        for a, b in ((x1, y1), (x2, y2)):
            net.veth(a, b)
            for end in (a, b):
                netns.no_ipv6(end)
                netns.set_link(end)
        rx = netns.packet_socket(y1)
        tx = [netns.packet_socket(x) for x in (x2, x1)]
        try:
            frames = [bytes.fromhex("02000000fe01020000000001") + b"\x88\xb5" + bytes([i]) * 50
                      for i in (2, 1)]
            for s, f in zip(tx, frames):
                s.send(f)
            rx.settimeout(5)
            assert rx.recv(2048) == frames[1]
            rx.setblocking(False)
            with pytest.raises(BlockingIOError):
                rx.recv(2048)
        finally:
            for s in (rx, *tx):
                s.close()


def test_a_graph_builds_an_l2_star_file_and_a_management_bridge_onto_its_hosts(root):
    """spina/netgraph.py `Graph` on l2_star8.yaml's first 2 hosts: the switch's ports in the
    root namespace (tbf on them), each host's eth0 with the segment's address and MAC and
    static neighbours for the switch and the other host; mgmt8.yaml built onto the same
    namespaces (`at`): mgmt0 on a root bridge at 10.9.0.100 that carries a datagram from h1 to
    the root namespace; closing both leaves nothing."""
    import socket

    from spina import topology
    from spina.netgraph import Graph
    topos = pathlib.Path(__file__).resolve().parents[1] / "bench" / "topologies"
    star = topology.first_hosts(topology.load(str(topos / "l2_star8.yaml")), 2)
    mgmt = topology.first_hosts(topology.load(str(topos / "mgmt8.yaml")), 2)
    with Graph(star, TAG) as g:
        assert g.ports("s0") == {1: f"{TAG}s0p1", 2: f"{TAG}s0p2"}
        assert [g.ns(h) for h in ("s0", "h0", "h1")] == [None, f"{TAG}-h0", f"{TAG}-h1"]
        info = _link(g.ns("h1"), "eth0")
        assert (info["address"], [(x["local"], x["prefixlen"]) for x in info["addr_info"]]) \
            == ("02:00:00:00:01:01", [("10.0.0.2", 24)])
        neigh = json.loads(netns.ip("-j", "neigh", "show", "dev", "eth0", ns=g.ns("h1")).stdout)
        assert sorted((n["dst"], n["lladdr"], n["state"]) for n in neigh) == [
            ("10.0.0.1", "02:00:00:00:01:00", ["PERMANENT"]),
            ("10.0.0.100", "02:00:00:00:00:64", ["PERMANENT"])]
        q = json.loads(netns.tc("-j", "qdisc", "show", "dev", f"{TAG}s0p2").stdout)[0]
        assert (q["kind"], q["options"]["rate"]) == ("tbf", 1_250_000_000)  # 10gbit in B/s
        with Graph(mgmt, f"{TAG}m", at={h: g.ns(h) for h in mgmt.hosts}, if_prefix="mgmt") as m:
            assert m.ns("h1") == g.ns("h1") and m.ports("m0") == {1: f"{TAG}ms0p1",
                                                                  2: f"{TAG}ms0p2"}
            addr = _link(g.ns("h1"), "mgmt0")["addr_info"]
            assert [(x["local"], x["prefixlen"]) for x in addr] == [("10.9.0.2", 24)]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
                rx.bind(("10.9.0.100", 0))
                rx.settimeout(10)
                netns.in_ns(g.ns("h1"), sys.executable, "-c",
                            "import socket, sys; socket.socket(socket.AF_INET, "
                            "socket.SOCK_DGRAM).sendto(b'mgmt', ('10.9.0.100', int(sys.argv[1])))",
                            rx.getsockname()[1])
                data, src = rx.recvfrom(16)
            assert (data, src[0]) == (b"mgmt", "10.9.0.2")
        assert not os.path.exists(f"/sys/class/net/{TAG}ms0p1")  # its links went with it
        assert os.path.exists(f"/sys/class/net/{TAG}s0p1")  # the star's are still there
    assert not os.path.exists(f"/sys/class/net/{TAG}s0p1")
    assert netns.leftover_namespaces(TAG) == []


def test_the_bmv2_ports_file_builds_veth_pairs_in_the_root_namespace(root):
    """bench/topologies/ports4.yaml as bmv2_tests/bmv2.py builds it (no BMv2 needed):
    ports 1..4, both ends of each pair in the root namespace, up, IPv6 off, no address, and a
    frame written on a host end arrives on its switch port; closing removes all eight."""
    from bmv2_tests.bmv2 import PORTS_FILE
    from bmv2_tests.target import PORTS
    from spina import topology
    from spina.netgraph import Graph
    topo = topology.load(str(PORTS_FILE))
    with Graph(topo, TAG, at={h: None for h in topo.hosts}) as g:
        sw = g.ports("s0")
        hosts = {p: g.ifname(i, h) for p, (i, h) in topo.ports("s0").items()}
        assert tuple(sw) == PORTS and sw[1] == f"{TAG}s0p1" and hosts[1] == f"{TAG}h1e0"
        for ifc in (*sw.values(), *hosts.values()):
            info = _link(None, ifc)
            assert "UP" in info["flags"] and info["addr_info"] == [], ifc
            with open(f"/proc/sys/net/ipv6/conf/{ifc}/disable_ipv6") as f:
                assert f.read() == "1\n", ifc
        rx, tx = netns.packet_socket(sw[3]), netns.packet_socket(hosts[3])
        try:
            frame = bytes.fromhex("02000000fe03020000000003") + b"\x88\xb5" + bytes(50)
            tx.send(frame)
            rx.settimeout(5)
            assert rx.recv(2048) == frame
        finally:
            rx.close()
            tx.close()
    assert not any(os.path.exists(f"/sys/class/net/{ifc}")
                   for ifc in (*sw.values(), *hosts.values()))
