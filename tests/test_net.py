"""spina.net's port chooser: the ports tests and the launcher bind right after choosing."""
from __future__ import annotations

import os
import socket

from spina import net


def test_free_ports_are_new_each_call_and_never_ephemeral():
    """Ports from below the ephemeral range (a port-0 bind in between can never be given one),
    none handed out twice in this process, each bindable for UDP and TCP."""
    lo, hi = net._ephemeral_range()
    seen = set()
    for _ in range(50):
        ports = net.free_ports(4)
        assert len(set(ports)) == 4
        assert not seen & set(ports)
        seen |= set(ports)
    assert all(not lo <= p <= hi for p in seen)
    port = net.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
        u.bind(("127.0.0.1", port))
        t.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over():
    chooser = net._PortChooser()
    first = chooser.choose(1, "127.0.0.1")[0]
    chooser.next = first  # the next choice would be `first` again: hold it for TCP only
    with socket.socket() as t:
        t.bind(("127.0.0.1", first))
        again = chooser.choose(1, "127.0.0.1")[0]
    assert again != first


def test_a_port_another_process_handed_out_is_passed_over():
    """A second chooser (as in another process, or a forked child with the same position)
    never hands out a port the first one did: the machine-wide record (RESERVE_DIR) says so,
    though the port is still unbound (a job file's worker port before its worker runs)."""
    first = net.free_ports(3)
    other = net._PortChooser()
    other.next = first[0]
    again = other.choose(3, "127.0.0.1")
    assert not set(again) & set(first)
    assert all(os.path.exists(os.path.join(net.RESERVE_DIR, str(p))) for p in first + again)
