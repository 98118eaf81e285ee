"""Network namespaces and the links between them: the one owner of the primitives that the
benchmarks' and tests' topology files (spina/netgraph.py `Graph`), the BMv2 target's ports
(bmv2_tests/bmv2.py) and the testbed build their networks from.

Every command is iproute2's (`ip`, `tc`) or a tool run inside a namespace (`sysctl`, `ethtool`,
`iptables`), its output captured; a failing one raises CalledProcessError carrying the tool's
message in `.stderr`. A namespace `ns` is a name under /var/run/netns, a process id (the
namespace that process lives in: a mininet host's), or None for the root namespace.

`packet_socket` opens the raw socket of one port (a switch's, a test host's) that takes that
interface's frames and no other's.

`Network` records what a builder made and removes it all on close(), also when the build fails
part way (`with net.building():`). A child process joins a namespace with `enter()` before it
opens a socket. Needs root.

It lives in spina/ (the shared core, stdlib only) because tests/, bench/ and testbed/ all
import spina already, and the module map lets every one of them import it.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import threading

_CLONE_NEWNET = 0x40000000


def run(*cmd, check: bool = True) -> subprocess.CompletedProcess:
    """Run `cmd` with its output captured as text."""
    return subprocess.run([str(c) for c in cmd], check=check, capture_output=True, text=True)


def _net_path(ns: str | int) -> str:
    return f"/proc/{ns}/ns/net" if isinstance(ns, int) else f"/var/run/netns/{ns}"


def _tool(tool: str, args, ns) -> list:
    """`tool args` in namespace `ns`: iproute2's own `-n` for a named one, nsenter for a pid."""
    if ns is None:
        return [tool, *args]
    if isinstance(ns, int):
        return ["nsenter", f"--net={_net_path(ns)}", tool, *args]
    return [tool, "-n", ns, *args]


def ip(*args, ns=None, check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS` in namespace `ns`."""
    return run(*_tool("ip", args, ns), check=check)


def tc(*args, ns=None, check: bool = True) -> subprocess.CompletedProcess:
    """`tc ARGS` in namespace `ns`."""
    return run(*_tool("tc", args, ns), check=check)


def command(ns, *cmd) -> list[str]:
    """The argv that runs `cmd` in namespace `ns` (None: here), for Popen."""
    if ns is None:
        prefix = []
    elif isinstance(ns, int):
        prefix = ["nsenter", f"--net={_net_path(ns)}"]
    else:
        prefix = ["ip", "netns", "exec", ns]
    return [*prefix, *(str(c) for c in cmd)]


def in_ns(ns, *cmd, check: bool = True) -> subprocess.CompletedProcess:
    """Run `cmd` in namespace `ns` (None: here), its output captured."""
    return run(*command(ns, *cmd), check=check)


def unique_tag(prefix: str, modulo: int = 100000) -> str:
    """`prefix` + this process's id mod `modulo`: names two runs at once do not share (keep
    it short: interface names are at most 15 characters)."""
    return f"{prefix}{os.getpid() % modulo}"


def sysctl(ns, *settings: str, check: bool = True) -> None:
    """`sysctl -qw KEY=VALUE` for each setting, in namespace `ns`."""
    for s in settings:
        in_ns(ns, "sysctl", "-qw", s, check=check)


def no_ipv6(ifc: str, ns=None) -> None:
    """IPv6 off on `ifc`: router solicitations and the like would show up in counters."""
    sysctl(ns, f"net.ipv6.conf.{ifc}.disable_ipv6=1", check=False)


def offload_off(ifc: str, ns=None, features=("tx",)) -> None:
    """`ethtool -K ifc <feature> off ...`: checksums filled in by software (raw-socket
    switches see correct ones), or with tso/gso/gro MTU-sized frames; best effort."""
    in_ns(ns, "ethtool", "-K", ifc, *(w for f in features for w in (f, "off")), check=False)


def set_link(ifc: str, ns=None, *, name: str | None = None, address: str | None = None,
             mtu: int | None = None, master: str | None = None, up: bool = True) -> None:
    """`ip link set ifc [name] [address] [mtu] [master] [up]` in namespace `ns`."""
    args = ["link", "set", ifc]
    for key, value in (("name", name), ("address", address), ("mtu", mtu), ("master", master)):
        if value is not None:
            args += [key, value]
    ip(*args, *(["up"] if up else []), ns=ns)


def add_addr(ifc: str, cidr: str, ns=None) -> None:
    ip("addr", "add", cidr, "dev", ifc, ns=ns)


def static_arp(ifc: str, addr: str, mac: str, ns=None, replace: bool = False) -> None:
    """A permanent neighbour entry (our switches do not answer ARP)."""
    ip("neigh", "replace" if replace else "add", addr, "lladdr", mac, "dev", ifc, "nud",
       "permanent", ns=ns)


def add_route(dest: str, ns=None, *, via: str | None = None, dev: str | None = None,
              src: str | None = None, replace: bool = False) -> None:
    args = ["route", "replace" if replace else "add", dest]
    for key, value in (("via", via), ("dev", dev), ("src", src)):
        if value is not None:
            args += [key, value]
    ip(*args, ns=ns)


def tbf(ifc: str, rate: str, burst: int, latency_ms: float, ns=None) -> None:
    """Limit `ifc`'s egress to `rate` with a tbf qdisc: `burst` bytes of bucket, a queue of
    `latency_ms` at line rate (this kernel has no netem; tbf works in namespaces)."""
    tc("qdisc", "replace", "dev", ifc, "root", "tbf", "rate", rate, "burst", burst,
       "latency", f"{latency_ms}ms", ns=ns)


def qdisc_drops(ifc: str, ns=None, kind: str = "tbf") -> int:
    """Packets `ifc`'s qdiscs of `kind` dropped so far (0 if there is none)."""
    out = tc("-s", "-j", "qdisc", "show", "dev", ifc, ns=ns, check=False)
    try:
        return sum(q.get("drops", 0) for q in json.loads(out.stdout or "[]")
                   if q.get("kind") == kind)
    except json.JSONDecodeError:
        return 0


def random_drop(ns, p: float, chains=("OUTPUT", "INPUT"), flush: bool = False) -> None:
    """iptables drops UDP datagrams at random, probability `p` each, on `chains` in `ns`
    (OUTPUT: what it sends, INPUT: what it receives); `flush` clears the chains first."""
    for chain in chains:
        if flush:
            in_ns(ns, "iptables", "-F", chain)
        if p > 0:
            in_ns(ns, "iptables", "-A", chain, "-p", "udp", "-m", "statistic", "--mode",
                  "random", "--probability", str(p), "-j", "DROP")


def random_drops(ns) -> int:
    """Packets the DROP rules in `ns` discarded so far, all chains."""
    out = in_ns(ns, "iptables", "-L", "-v", "-n", "-x", check=False).stdout
    return sum(int(line.split()[0]) for line in out.splitlines()
               if "DROP" in line and line.split()[0].isdigit())


def enter(ns: str | None) -> None:
    """Move the calling process (its current thread, before it starts others) into `ns`."""
    if ns is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(_net_path(ns), os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


class _TermUnwinds:
    """While a Network holds namespaces, SIGTERM in the process that made them raises
    SystemExit, so `with` blocks and finally clauses remove them (a bench stopped by
    `timeout` used to leave its namespaces behind). Installed only over the default
    handler and from the main thread; the default comes back when the last Network closes.
    A forked child that inherits the handler dies of SIGTERM as before."""
    users = 0
    owner: int | None = None
    installed = False

    @classmethod
    def hold(cls) -> None:
        cls.users += 1
        if (cls.users == 1 and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            cls.owner, cls.installed = os.getpid(), True
            signal.signal(signal.SIGTERM, cls._on_term)

    @classmethod
    def release(cls) -> None:
        cls.users = max(0, cls.users - 1)
        if (cls.users == 0 and cls.installed and os.getpid() == cls.owner
                and threading.current_thread() is threading.main_thread()):
            cls.installed = False
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    @classmethod
    def _on_term(cls, signum, frame):
        if os.getpid() != cls.owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise SystemExit(128 + signum)


class Network:
    """What one builder made: namespaces and root-namespace links. close() deletes them all
    (links first, then namespaces, each last made first; a namespace takes its devices, veth
    peers and qdiscs with it). A context manager: leaving the `with` closes. While it holds
    namespaces, SIGTERM unwinds the process that made them (_TermUnwinds), so they go too."""

    def __init__(self):
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self._holds_term = False

    def namespace(self, name: str) -> str:
        """A new namespace with loopback up and IPv6 off (router solicitations and the like
        would show up in byte counters and queues)."""
        if not self._holds_term:
            _TermUnwinds.hold()
            self._holds_term = True
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("link", "set", "lo", "up", ns=name)
        sysctl(name, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
               check=False)
        return name

    def veth(self, a: str, b: str, *, a_ns=None, b_ns=None, mtu: int | None = None) -> None:
        """A veth pair, end `a` in namespace `a_ns` and `b` in `b_ns` (None: the root one),
        each created where it stays: no device passes through another namespace's names."""
        def end(name, ns):
            return (["name", name] + (["netns", ns] if ns is not None else [])
                    + (["mtu", mtu] if mtu is not None else []))
        ip("link", "add", *end(a, a_ns), "type", "veth", "peer", *end(b, b_ns))
        if a_ns is None or b_ns is None:  # its root end: the other one may be a foreign ns
            self.links.append(a if a_ns is None else b)

    def bridge(self, name: str, ns=None, mtu: int | None = None) -> None:
        ip("link", "add", "name", name, *(["mtu", mtu] if mtu is not None else []),
           "type", "bridge", ns=ns)
        if ns is None:
            self.links.append(name)

    @contextlib.contextmanager
    def building(self):
        """`with net.building():` build; if anything raises, everything made is removed."""
        try:
            yield self
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        while self.links:
            ip("link", "del", self.links.pop(), check=False)
        while self.namespaces:
            ip("netns", "del", self.namespaces.pop(), check=False)
        if self._holds_term:
            self._holds_term = False
            _TermUnwinds.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ETH_P_ALL = 0x0003  # every protocol: a switch port's or a test host's raw socket


def packet_socket(ifname: str) -> socket.socket:
    """An AF_PACKET raw socket that receives every frame of `ifname` and of no other interface:
    opened with protocol 0 (it takes nothing) and given ETH_P_ALL when bound. One opened with
    ETH_P_ALL takes every interface's frames until bind(), and keeps them queued: another
    run's, on a shared machine."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        s.bind((ifname, ETH_P_ALL))  # (Python puts the protocol in network order itself)
    except OSError:
        s.close()
        raise
    return s


def leftover_namespaces(tag: str) -> list[str]:
    """Namespaces of run `tag` (named `tag-...`; after a run: should be none)."""
    out = ip("netns", "list", check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.split() and ln.startswith(tag + "-")]


@contextlib.contextmanager
def removing_leftovers(tag: str):
    """`with removing_leftovers(tag) as left:` run something that builds namespaces of run
    `tag`; on leaving (also on failure) any of them still there are deleted and listed in
    `left` (a test asserts it is empty)."""
    left: list[str] = []
    try:
        yield left
    finally:
        left += leftover_namespaces(tag)
        for ns in left:
            ip("netns", "del", ns, check=False)


def why_no_namespaces() -> str | None:
    """Why this process cannot build namespaces, veth and tc qdiscs, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces, veth, tc and raw sockets"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not installed (iproute2)" if missing else None
