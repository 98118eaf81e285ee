"""Test hosts in network namespaces, built from topology files (spina/netgraph.py `Graph`):
`hosts` are the first n hosts of bench/topologies/l2_star8.yaml, on the ports of an L2 switch
that stay in the root namespace; `managed_hosts` puts them also on bench/topologies/mgmt8.yaml's
management bridge (imported by tests); `managed_network` does the same for a whole file (the
seams' leaf/spine fabrics, bench/topologies/seams_*.yaml).

Host h<r> is a namespace with eth0 = 10.0.0.(r+1)/24, MAC 02:00:00:00:01:<r>, and static
neighbours for the switch and the other hosts (the file's segment); the switch end of its veth
is port r+1. Everything made is removed again, also when a test fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from controller.controller import program_star
from softswitch.dataplane import Dataplane
from softswitch.l2 import L2Switch
from softswitch.p4runtime_server import SoftSwitchServicer
from spina import netns, topology
from spina.config import JobConfig, WorkerAddr
from spina.netgraph import Graph

ROOT = pathlib.Path(__file__).resolve().parents[1]
L2_STAR = topology.load(str(ROOT / "bench/topologies/l2_star8.yaml"))
MGMT = topology.load(str(ROOT / "bench/topologies/mgmt8.yaml"))
PORTS4 = topology.load(str(ROOT / "bench/topologies/ports4.yaml"))
SWITCH = "s0"  # the file's L2 switch: the tests run it (an L2Switch) on its ports
SWITCH_IP, SWITCH_MAC = L2_STAR.segments[SWITCH].address, L2_STAR.segments[SWITCH].mac
MGMT_IP = MGMT.segments["m0"].address  # the root namespace on the hosts' management bridge
TAG = netns.unique_tag("sp")


def host_mac(r: int) -> str:
    """Host h<r>'s MAC on the switch (the file's)."""
    return L2_STAR.segment_mac(SWITCH, r + 1)


def host_ip(r: int) -> str:
    """Host h<r>'s address on the switch (the file's)."""
    return L2_STAR.segment_address(SWITCH, r + 1)


@pytest.fixture
def hosts(request):
    """n namespaces h0..h(n-1) (the file's first n): [(namespace, its switch port's
    interface)]."""
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(why)
    g = Graph(topology.first_hosts(L2_STAR, request.param), TAG)
    try:
        g.create()  # which removes all it made if it fails
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot create namespaces/veth here: {getattr(e, 'stderr', e)}")
    ports = g.ports(SWITCH)
    try:
        yield [(g.ns(h), ports[r + 1]) for r, h in enumerate(g.topo.hosts)]
    finally:
        g.close()


@pytest.fixture
def managed_hosts(hosts):
    """`hosts`, each also on the management bridge (mgmt0 = 10.9.0.(r+1)/24; the root's
    address MGMT_IP): the control traffic a deployment has besides the data path (the run
    rendezvous of `controller serve`)."""
    try:
        with management_bridge([ns for ns, _ in hosts]):
            yield hosts
    except ManagementError as e:
        pytest.skip(f"cannot create the management bridge here: {e}")


class ManagementError(Exception):
    """The management bridge could not be made (nothing of it is left)."""


@contextlib.contextmanager
def management_bridge(namespaces: list[str | int]):
    """mgmt8.yaml's bridge in the root namespace at MGMT_IP/24 and, in each namespace (a name
    under /var/run/netns, or a process id: a mininet host's), mgmt0 = 10.9.0.(r+1)/24 on a
    veth to it. Everything made is removed on exit."""
    topo = topology.first_hosts(MGMT, len(namespaces))
    g = Graph(topo, f"{TAG}m", at=dict(zip(topo.hosts, namespaces)), if_prefix="mgmt")
    try:
        g.create()
    except (subprocess.CalledProcessError, OSError) as e:
        raise ManagementError(getattr(e, "stderr", None) or str(e)) from None
    try:
        yield
    finally:
        g.close()


@contextlib.contextmanager
def root_ports(n: int, tag: str):
    """ports4.yaml's first n ports, both ends of each veth pair in the root namespace, named
    by `tag`: ({port: the switch's interface}, {port: the test's}), removed on exit."""
    topo = topology.first_hosts(PORTS4, n)
    g = Graph(topo, tag, at={h: None for h in topo.hosts}).create()
    try:
        yield g.ports("s0"), {p: g.ifname(i, h) for p, (i, h) in topo.ports("s0").items()}
    finally:
        g.close()


@contextlib.contextmanager
def managed_network(path: str, tag: str):
    """The topology file `path` (bench/topologies/: hosts on switches whose ports stay in the
    root namespace) built by Graph, its hosts also on the management bridge; the Graph.
    Skips, saying why, where namespaces or the bridge cannot be made; removed on exit."""
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(why)
    g = Graph(topology.load(path), tag)
    try:
        g.create()  # which removes all it made if it fails
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot create namespaces/veth here: {getattr(e, 'stderr', e)}")
    try:
        with management_bridge([g.ns(h) for h in g.topo.hosts]):
            yield g
    except ManagementError as e:
        pytest.skip(f"cannot create the management bridge here: {e}")
    finally:
        g.close()


def run_workers(hosts, job: JobConfig, seed: int = 3, n: int = 6000, timeout: float = 90,
                setup_ns=None):
    """All-reduce through an L2-mode software switch with one agent process per host.

    setup_ns(ns) runs in each namespace before its worker starts (e.g. iptables loss).
    Returns (the workers' JSON reports, the switch's Dataplane).
    """
    nw = len(hosts)
    dp = Dataplane()
    program_star(SoftSwitchServicer(dp), job, SWITCH_IP,
                 [host_mac(r) for r in range(nw)],
                 pool_slots=dp.pipeline.pool_slots, slot_capacity=dp.pipeline.slot_capacity)
    jd = json.dumps({"job": job.job, "nslots": job.nslots, "block_size": job.block_size,
                     "nlanes": job.nlanes,
                     "workers": [{"host": w.host, "port": w.port} for w in job.workers]})
    procs = []
    with L2Switch({r + 1: sw_if for r, (_, sw_if) in enumerate(hosts)}, dp):
        try:
            for r, (ns, _) in enumerate(hosts):
                if setup_ns is not None:
                    setup_ns(ns)
                procs.append(subprocess.Popen(
                    netns.command(ns, sys.executable, "-m", "tests.netns_worker", jd,
                                  r, SWITCH_IP, 47000, seed, n),
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=timeout)
                assert p.returncode == 0, err[-2000:]
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return outs, dp


def workers_job(nw: int, job: int = 5) -> JobConfig:
    """A job of the hosts' agents with the P4 program's sizes."""
    return JobConfig(job=job, workers=tuple(WorkerAddr(r, host_ip(r), 50000 + r)
                                            for r in range(nw)),
                     nslots=8, block_size=32, nlanes=4)


def run_bench(module: str, prefix: str, args: list[str], timeout: float):
    """`python -m module ARGS --tag TAG` in namespaces tagged prefix + pid, skipping (the reason
    printed) where namespaces cannot be made; it must exit 0 and leave no namespace behind."""
    why = netns.why_no_namespaces()
    if why:
        print(f"skipping: {why}")
        pytest.skip(why)
    tag = f"{prefix}{os.getpid() % 100000}"
    with netns.removing_leftovers(tag) as left:
        out = subprocess.run([sys.executable, "-m", module, *args, "--tag", tag], cwd=ROOT,
                             capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    assert left == [], f"namespaces left behind: {left}"
    return out
