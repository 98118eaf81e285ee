"""A star of network namespaces for the `loss` sweep: the switch and every worker in its own
namespace, joined by a bridge; iptables drops UDP at random in the workers' namespaces.

    switch ns  br0 10.77.0.100/24 ── veth ── worker ns r: eth0 10.77.0.(r+1)/24
                                             iptables OUTPUT, INPUT: DROP with probability p

Loss is applied at the workers, both directions (worker -> switch on OUTPUT, switch -> worker
on INPUT), as tests/test_netns_loss.py does: this kernel has no netem. The links carry 64 KB
MTUs so the benchmark's 57 KB datagrams are not fragmented (one datagram = one drop decision).
A child process joins its namespace with `enter()` before it opens a socket. Everything made
is removed again on exit, also on errors. Needs root, iproute2 and iptables.
"""
from __future__ import annotations

import ctypes
import os
import subprocess

SUBNET = "10.77.0"
SWITCH_IP = f"{SUBNET}.100"
MTU = 65000
_CLONE_NEWNET = 0x40000000


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def enter(ns: str | None) -> None:
    """Move the calling process (its current thread, before it starts others) into `ns`."""
    if ns is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def worker_ip(rank: int) -> str:
    return f"{SUBNET}.{rank + 1}"


class Star:
    """`nworkers` worker namespaces and one switch namespace; `.loss(p)` sets random loss."""

    def __init__(self, nworkers: int, tag: str | None = None):
        self.tag = tag or f"sl{os.getpid() % 100000}"
        self.switch_ns = f"{self.tag}-sw"
        self.worker_ns = [f"{self.tag}-w{r}" for r in range(nworkers)]
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        sw = self.switch_ns
        _run("ip", "netns", "add", sw)
        self._made.append(sw)
        _run("ip", "-n", sw, "link", "add", "br0", "mtu", str(MTU), "type", "bridge")
        _run("ip", "-n", sw, "addr", "add", f"{SWITCH_IP}/24", "dev", "br0")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        _run("ip", "-n", sw, "link", "set", "lo", "up")
        for r, ns in enumerate(self.worker_ns):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            # Created inside the worker's namespace, the switch end moved out: no device ever
            # appears in the root namespace.
            _run("ip", "-n", ns, "link", "add", "eth0", "mtu", str(MTU), "type", "veth",
                 "peer", "name", f"p{r}", "mtu", str(MTU), "netns", sw)
            _run("ip", "-n", ns, "addr", "add", f"{worker_ip(r)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", sw, "link", "set", f"p{r}", "master", "br0", "up")

    def loss(self, p: float) -> None:
        """Drop UDP datagrams at random with probability `p` each way at every worker."""
        for ns in self.worker_ns:
            for chain in ("OUTPUT", "INPUT"):
                _run("ip", "netns", "exec", ns, "iptables", "-F", chain)
                if p > 0:
                    _run("ip", "netns", "exec", ns, "iptables", "-A", chain, "-p", "udp", "-m",
                         "statistic", "--mode", "random", "--probability", str(p), "-j", "DROP")

    def dropped(self) -> int:
        """Datagrams the DROP rules discarded so far, all workers, both directions."""
        total = 0
        for ns in self.worker_ns:
            out = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-L", "-v", "-n", "-x"],
                                 capture_output=True, text=True).stdout
            total += sum(int(line.split()[0]) for line in out.splitlines()
                         if "DROP" in line and line.split()[0].isdigit())
        return total

    def close(self) -> None:
        for ns in reversed(self._made):  # deleting a namespace deletes its veth ends too
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
