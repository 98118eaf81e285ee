"""What the benchmarks measure on a namespace network (spina/netgraph.py `Graph` builds it from
a topology file): a link's bytes (`dev_bytes`), the kernel's loss counters, and the star the
collectives and training WHATs run on (`star_of`, `check_star`).
"""
from __future__ import annotations

from spina import netns
from spina.topology import Topology

WORKER_IF = "eth0"  # a host's first link (Graph.ifname): where dev_bytes counts


def dev_bytes(iface: str = WORKER_IF, pid: int | None = None) -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of `iface` in the calling thread's namespace, or in the one process
    `pid` lives in (link-layer bytes: Ethernet + IP + UDP/TCP headers included, as
    /sys/class/net/*/statistics count them)."""
    with open(f"/proc/{pid}/net/dev" if pid else "/proc/thread-self/net/dev") as f:
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


def kernel_losses_total(pids) -> dict:
    """kernel_losses summed over processes, one in each namespace of interest."""
    out = dict(udp_drops=0, tcp_retrans=0)
    for pid in pids:
        for k, v in kernel_losses(pid).items():
            out[k] += v
    return out


# ----------------------------------------------------------------------------- stars
def star_of(topo: Topology) -> tuple[str, list[str]] | str:
    """(the aggregating switch, the hosts) of a star topology, or why it is not one."""
    if len(topo.aggregating) != 1 or max(topo.devices) != 1:
        return "needs one aggregating switch and hosts of one device"
    sw = topo.aggregating[0]
    if sw in topo.segments:
        return f"needs {sw} to be a router (its software switch runs in its namespace)"
    if sorted(tuple(sorted((ln.a, ln.b))) for ln in topo.links) != sorted(
            tuple(sorted((h, sw))) for h in topo.hosts):
        return f"needs one link from every host to {sw} and no other"
    return sw, list(topo.hosts)


def check_star(a) -> str | None:
    """A harness option error if -t is not a star of -g hosts or namespaces cannot be built."""
    star = star_of(a.topo)
    if isinstance(star, str):
        return f"argument -t/--topology: {a.topology}: {star}"
    if a.workers != [len(star[1])]:
        return (f"argument -g/--workers: {a.topology} has {len(star[1])} hosts (give -g "
                f"{len(star[1])} or another file)")
    why = netns.why_no_namespaces()
    return f"argument -t/--topology: {why}" if why else None
