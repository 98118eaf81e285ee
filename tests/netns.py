"""Test hosts in network namespaces: one veth each to a switch port (imported by tests).

Each host h<r> is a namespace with eth0 = 10.0.0.(r+1)/24, MAC 02:00:00:00:01:<r>, and a
static ARP entry for the switch; the switch end of its veth stays in the root namespace.
Everything made is removed again, also when a test fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from controller.controller import program_star
from softswitch.dataplane import Dataplane
from softswitch.l2 import L2Switch
from softswitch.p4runtime_server import SoftSwitchServicer
from spina.config import JobConfig, WorkerAddr

ROOT = pathlib.Path(__file__).resolve().parents[1]
SWITCH_IP, SWITCH_MAC = "10.0.0.100", "02:00:00:00:00:64"
TAG = f"sp{os.getpid() % 100000}"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _ns_run(ns, *cmd):
    subprocess.run(["ip", "netns", "exec", ns, *cmd], check=False, capture_output=True)


@pytest.fixture
def hosts(request):
    """n namespaces h0..h(n-1): 10.0.0.(r+1)/24 on eth0, static ARP for the switch."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    n = request.param
    made_ns, made_links = [], []
    try:
        for r in range(n):
            ns, sw_if, h_if = f"{TAG}-h{r}", f"{TAG}s{r}", f"{TAG}h{r}"
            _ip("netns", "add", ns)
            made_ns.append(ns)
            _ip("link", "add", sw_if, "type", "veth", "peer", "name", h_if)
            made_links.append(sw_if)
            _ip("link", "set", h_if, "netns", ns)
            _ns_run(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            _ip("-n", ns, "link", "set", h_if, "name", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "address", f"02:00:00:00:01:{r:02x}")
            _ip("-n", ns, "addr", "add", f"10.0.0.{r + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "neigh", "add", SWITCH_IP, "lladdr", SWITCH_MAC, "dev", "eth0",
                "nud", "permanent")
            _ns_run(ns, "ethtool", "-K", "eth0", "tx", "off")
            subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{sw_if}.disable_ipv6=1"],
                           check=False, capture_output=True)
            _ip("link", "set", sw_if, "up")
    except (subprocess.CalledProcessError, OSError) as e:
        _cleanup(made_ns, made_links)
        pytest.skip(f"cannot create namespaces/veth here: {getattr(e, 'stderr', e)}")
    yield [(f"{TAG}-h{r}", f"{TAG}s{r}") for r in range(n)]
    _cleanup(made_ns, made_links)


MGMT_IP = "10.9.0.100"  # the root namespace on the hosts' management bridge


@pytest.fixture
def managed_hosts(hosts):
    """`hosts`, each also on a management bridge in the root namespace (mgmt0 =
    10.9.0.(r+1)/24; the root's address MGMT_IP): the control traffic a deployment has
    besides the data path (the run rendezvous of `controller serve`)."""
    try:
        with management_bridge([ns for ns, _ in hosts]):
            yield hosts
    except ManagementError as e:
        pytest.skip(f"cannot create the management bridge here: {e}")


class ManagementError(Exception):
    """The management bridge could not be made (nothing of it is left)."""


@contextlib.contextmanager
def management_bridge(namespaces: list[str | int]):
    """A bridge in the root namespace at MGMT_IP/24 and, in each namespace (a name under
    /var/run/netns, or a process id: a mininet host's), mgmt0 = 10.9.0.(r+1)/24 on a veth to
    it. Everything made is removed on exit."""
    bridge, links = f"{TAG}br", []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        links.append(bridge)
        _ip("addr", "add", f"{MGMT_IP}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for r, ns in enumerate(namespaces):
            root_if, ns_if = f"{TAG}m{r}", f"{TAG}n{r}"
            _ip("link", "add", root_if, "type", "veth", "peer", "name", ns_if)
            links.append(root_if)
            _ip("link", "set", ns_if, "netns", str(ns))
            net = f"/proc/{ns}/ns/net" if isinstance(ns, int) else f"/var/run/netns/{ns}"
            for args in (("link", "set", ns_if, "name", "mgmt0"),
                         ("addr", "add", f"10.9.0.{r + 1}/24", "dev", "mgmt0"),
                         ("link", "set", "mgmt0", "up")):
                subprocess.run(["nsenter", f"--net={net}", "ip", *args], check=True,
                               capture_output=True, text=True)
            _ip("link", "set", root_if, "master", bridge)
            _ip("link", "set", root_if, "up")
    except (subprocess.CalledProcessError, OSError) as e:
        _cleanup([], links)
        raise ManagementError(getattr(e, "stderr", None) or str(e)) from None
    try:
        yield
    finally:
        _cleanup([], links)


@pytest.fixture
def veth_pairs():
    """make(a, b): a veth pair a <-> b in the root namespace, up (IPv6 off, checksum offload
    off, as a switch's ports need): the links between two switch processes. Every pair made
    is removed after the test."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for veth pairs")
    made = []

    def make(a: str, b: str) -> tuple[str, str]:
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        made.append(a)
        for end in (a, b):
            subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{end}.disable_ipv6=1"],
                           check=False, capture_output=True)
            subprocess.run(["ethtool", "-K", end, "tx", "off"], check=False,
                           capture_output=True)
            _ip("link", "set", end, "up")
        return a, b

    yield make
    _cleanup([], made)


def _cleanup(namespaces, links):
    for link in links:
        _ip("link", "del", link, check=False)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)


def run_workers(hosts, job: JobConfig, seed: int = 3, n: int = 6000, timeout: float = 90,
                setup_ns=None):
    """All-reduce through an L2-mode software switch with one agent process per host.

    setup_ns(ns) runs in each namespace before its worker starts (e.g. iptables loss).
    Returns (the workers' JSON reports, the switch's Dataplane).
    """
    nw = len(hosts)
    dp = Dataplane()
    program_star(SoftSwitchServicer(dp), job, SWITCH_IP,
                 [f"02:00:00:00:01:{r:02x}" for r in range(nw)],
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
                    ["ip", "netns", "exec", ns, sys.executable,
                     str(ROOT / "tests" / "netns_worker.py"), jd, str(r), SWITCH_IP, "47000",
                     str(seed), str(n)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
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
    return JobConfig(job=job, workers=tuple(WorkerAddr(r, f"10.0.0.{r + 1}", 50000 + r)
                                            for r in range(nw)),
                     nslots=8, block_size=32, nlanes=4)
