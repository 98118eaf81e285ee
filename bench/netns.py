"""A star of network namespaces for the `loss` sweep: the switch and every worker in its own
namespace, joined by a bridge; iptables drops UDP at random in the workers' namespaces.

    switch ns  br0 10.77.0.100/24 ── veth ── worker ns r: eth0 10.77.0.(r+1)/24
                                             iptables OUTPUT, INPUT: DROP with probability p

Loss is applied at the workers, both directions (worker -> switch on OUTPUT, switch -> worker
on INPUT), as tests/test_netns_loss.py does: this kernel has no netem. The links carry 64 KB
MTUs so the benchmark's 57 KB datagrams are not fragmented (one datagram = one drop decision).
A child process joins its namespace with `spina.netns.enter()` before it opens a socket.
Everything made is removed again on exit, also on errors (the primitives: spina/netns.py).
Needs root, iproute2 and iptables.
"""
from __future__ import annotations

from spina import netns

SUBNET = "10.77.0"
SWITCH_IP = f"{SUBNET}.100"
MTU = 65000


def worker_ip(rank: int) -> str:
    return f"{SUBNET}.{rank + 1}"


class Star(netns.Network):
    """`nworkers` worker namespaces and one switch namespace; `.loss(p)` sets random loss."""

    def __init__(self, nworkers: int, tag: str | None = None):
        super().__init__()
        self.tag = tag or netns.unique_tag("sl")
        self.switch_ns = f"{self.tag}-sw"
        self.worker_ns = [f"{self.tag}-w{r}" for r in range(nworkers)]
        with self.building():
            self._build()

    def _build(self) -> None:
        sw = self.namespace(self.switch_ns)
        self.bridge("br0", sw, mtu=MTU)
        netns.add_addr("br0", f"{SWITCH_IP}/24", sw)
        netns.set_link("br0", sw)
        for r, ns in enumerate(self.worker_ns):
            self.namespace(ns)
            # Both ends created in their namespaces: no device ever appears in the root one.
            self.veth("eth0", f"p{r}", a_ns=ns, b_ns=sw, mtu=MTU)
            netns.add_addr("eth0", f"{worker_ip(r)}/24", ns)
            netns.set_link("eth0", ns)
            netns.set_link(f"p{r}", sw, master="br0")

    def loss(self, p: float) -> None:
        """Drop UDP datagrams at random with probability `p` each way at every worker."""
        for ns in self.worker_ns:
            netns.random_drop(ns, p, flush=True)

    def dropped(self) -> int:
        """Datagrams the DROP rules discarded so far, all workers, both directions."""
        return sum(netns.random_drops(ns) for ns in self.worker_ns)
