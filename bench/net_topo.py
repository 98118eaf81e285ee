"""A star of network namespaces with rate-limited links: the fabric of bench/net_bench.py.

```
  ns <tag>-w0: eth0 10.200.0.2/24 ──veth── s0 10.200.0.1/24 ┐
  ns <tag>-w1: eth0 10.200.1.2/24 ──veth── s1 10.200.1.1/24 ├ ns <tag>-sw: IPv4 router
  ...                                                       │  + SpINA's UdpSwitch on
  ns <tag>-w<n-1>: eth0 10.200.<n-1>.2/24 ──veth── s<n-1>  ┘    10.200.255.1 (on lo)
```

Every worker has its own namespace and one link to the switch namespace, which routes
between the workers' /24 subnets (kernel forwarding: the path of gloo's TCP ring) and holds
SpINA's software switch on an address of its own (the path of SpINA's datagrams). Both
methods therefore cross the same links. Each link is limited in BOTH directions by a tbf
qdisc: on the worker's eth0 (worker -> switch) and on the switch side s<r> (switch ->
worker), as a full-duplex port of a real top-of-rack switch.

Both veth ends are created directly inside their namespaces, so nothing is added to the
root namespace; deleting the namespaces removes the links and qdiscs with them.

Run as root. `Star` is a context manager: everything it made is removed on exit, also when
the body raises.
"""
from __future__ import annotations

import json
import re
import subprocess

SWITCH_IP = "10.200.255.1"
WORKER_IF = "eth0"
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(rate: str) -> float:
    """'1gbit', '10gbit', '500mbit' (tc's units) -> bits per second."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)bit\s*", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected a number with kbit, mbit, gbit or tbit")
    return float(m.group(1)) * _UNITS[m.group(2)]


def tbf_params(rate: str, mtu: int) -> dict:
    """tbf's burst and queue for a link of `rate`.

    burst: one millisecond at line rate, and never less than 128 KiB: tbf drops (or, for GSO
    packets, segments) anything larger than its bucket, and veth hands TCP segments of up to
    64 KiB to the qdisc. A 1 ms burst lets the link run at most 1 ms ahead of its rate,
    negligible against transfers of 0.1-0.5 s.
    latency (queue): 20 ms at line rate, 2.5 MB at 1 Gbit/s: more than SpINA's window
    (16 slots x 57 KB per worker, 0.9 MB) so the switch side never drops a result burst, and
    the port buffer of a real shallow-buffered switch is of that order.
    """
    bps = parse_rate(rate)
    burst = max(int(bps / 8 * 1e-3), 128 << 10, 2 * mtu)
    return dict(rate=rate, burst=burst, latency_ms=20)


def _run(*cmd, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def add_namespace(ns: str, made: list) -> None:
    """Create namespace `ns` (recorded in `made`, for cleanup) with loopback up and no IPv6:
    router solicitations and the like would show up in byte counters and queues."""
    _run("ip", "netns", "add", ns)
    made.append(ns)
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    for key in ("all", "default"):
        _run("ip", "netns", "exec", ns, "sysctl", "-qw",
             f"net.ipv6.conf.{key}.disable_ipv6=1", check=False)


def dev_bytes(iface: str = WORKER_IF) -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of `iface` in the calling thread's namespace (link-layer bytes:
    Ethernet + IP + UDP/TCP headers included, as /sys/class/net/*/statistics count them)."""
    with open("/proc/thread-self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                v = rest.split()
                return int(v[8]), int(v[0])
    raise OSError(f"no interface {iface} in this namespace")


def kernel_losses(pid: int) -> dict:
    """Loss counters of the namespace process `pid` lives in (/proc/<pid>/net/snmp):
    udp_drops = UDP datagrams dropped on receive (InErrors: full buffer, bad checksum) +
    IP reassemblies that failed (a fragment lost); tcp_retrans = TCP segments resent."""
    with open(f"/proc/{pid}/net/snmp") as f:
        lines = [ln.split() for ln in f]
    v = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        v.update({f"{head[0]}{k}": int(x) for k, x in zip(head[1:], vals[1:])})
    return dict(udp_drops=v.get("Udp:InErrors", 0) + v.get("Ip:ReasmFails", 0),
                tcp_retrans=v.get("Tcp:RetransSegs", 0))


class Star:
    """n worker namespaces around one switch namespace; see the module docstring.

    Args:
        n: workers.
        tag: prefix of the namespace names (unique per run; tests look for leftovers by it).
        mtu: MTU of every link (bench/README.md says why 9000 by default).
    """

    def __init__(self, n: int, tag: str, mtu: int = 9000):
        if not 1 <= n <= 250:
            raise ValueError(f"workers: need 1..250, got {n}")
        self.n, self.tag, self.mtu = n, tag, mtu
        self.switch_ns = f"{tag}-sw"
        self.made: list[str] = []
        self.rate: str | None = None

    def worker_ns(self, r: int) -> str:
        return f"{self.tag}-w{r}"

    @staticmethod
    def worker_ip(r: int) -> str:
        return f"10.200.{r}.2"

    def switch_if(self, r: int) -> str:
        return f"s{r}"

    def links(self):
        """(namespace, interface) of both ends of every link: the tbf'd egress points."""
        for r in range(self.n):
            yield self.worker_ns(r), WORKER_IF
            yield self.switch_ns, self.switch_if(r)

    # ------------------------------------------------------------------ build / remove
    def create(self) -> "Star":
        try:
            self._add_ns(self.switch_ns)
            sw = self.switch_ns
            _run("ip", "-n", sw, "addr", "add", f"{SWITCH_IP}/32", "dev", "lo")
            _run("ip", "netns", "exec", sw, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            for r in range(self.n):
                ns, sif = self.worker_ns(r), self.switch_if(r)
                self._add_ns(ns)
                _run("ip", "link", "add", "name", sif, "netns", sw, "type", "veth",
                     "peer", "name", WORKER_IF, "netns", ns)
                for where, ifc, addr in ((sw, sif, f"10.200.{r}.1/24"),
                                         (ns, WORKER_IF, f"{self.worker_ip(r)}/24")):
                    _run("ip", "-n", where, "link", "set", ifc, "mtu", str(self.mtu), "up")
                    _run("ip", "-n", where, "addr", "add", addr, "dev", ifc)
                _run("ip", "-n", ns, "route", "add", "default", "via", f"10.200.{r}.1")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        add_namespace(ns, self.made)

    def destroy(self) -> None:
        """Delete every namespace made (their links and qdiscs go with them)."""
        while self.made:
            _run("ip", "netns", "del", self.made.pop(), check=False)

    def __enter__(self) -> "Star":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # ------------------------------------------------------------------ rate limits
    def set_rate(self, rate: str) -> dict:
        """Limit both directions of every link to `rate` (tbf); returns tbf's parameters."""
        p = tbf_params(rate, self.mtu)
        for ns, ifc in self.links():
            _run("tc", "-n", ns, "qdisc", "replace", "dev", ifc, "root", "tbf", "rate", rate,
                 "burst", str(p["burst"]), "latency", f"{p['latency_ms']}ms")
        self.rate = rate
        return p

    def tbf_drops(self) -> int:
        """Packets dropped so far by every link's tbf (queue full or larger than the bucket)."""
        total = 0
        for ns, ifc in self.links():
            out = _run("tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", ifc, check=False)
            try:
                total += sum(q.get("drops", 0) for q in json.loads(out.stdout or "[]")
                             if q.get("kind") == "tbf")
            except json.JSONDecodeError:
                pass
        return total


def leftover_namespaces(tag: str) -> list[str]:
    """Namespaces of run `tag` (named `tag-...`; after a run: should be none)."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.split() and ln.startswith(tag + "-")]


def why_no_namespaces() -> str | None:
    """Why this process cannot build the benches' namespaces, or None."""
    import os
    import shutil
    if os.geteuid() != 0:
        return "needs root for network namespaces, veth, tc and raw sockets"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not installed (iproute2)" if missing else None
