"""A switch port that refuses: ridden through until the call's timeout, then named (issue 30
item 5, the agent's part; issue 44 item 9).

    python -m pytest -q tests/test_agent_refused.py

On loopback a datagram to a closed UDP port comes back as ICMP port unreachable; the agent's
socket reports it (IP_RECVERR). A switch process that restarts refuses until it listens again,
so a refusal is not fatal: the agent keeps resending, and says when the switch answers again.
A port that still refuses at the call's timeout fails the call naming the switch's address
(not a SpinaTimeout: no rank is to blame). tests/test_reliability.py kills and restarts a real
switch process mid-call.
"""
import logging
import socket
import threading

import numpy as np
import pytest

from host_agent.agent import Agent, SpinaError, SpinaTimeout
from softswitch.udp import UdpSwitch
from spina.config import JobConfig, WorkerAddr


def test_a_stopped_switch_fails_the_call_at_its_timeout_naming_its_address():
    """A switch that stopped: the call raises SpinaError naming host:port and the refusals
    once its timeout (1.5 s without progress) passed, and the agent's next call does the
    same."""
    sw = UdpSwitch(port=0).start()
    host, port = sw.address
    sw.stop()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    job = JobConfig(job=4, workers=(WorkerAddr(0, *s.getsockname()),
                                    WorkerAddr(1, "127.0.0.1", 9)))
    with Agent(job, 0, (host, port), sock=s, timeout=1.5) as agent:
        for call in (1, 2):
            with pytest.raises(SpinaError, match=f"job 4 call {call}: the switch at "
                               f"{host}:{port} refused every datagram") as e:
                agent.allreduce(np.ones(5000, np.float32))
            assert not isinstance(e.value, SpinaTimeout)
            assert "nothing listens on that port) until the call's timeout (1.5 s" \
                in str(e.value)
        assert agent.last_stats.packets_received == 0


def test_a_switch_that_starts_listening_mid_call_completes_it(caplog):
    """Nothing listens on the switch's port when the call starts; a switch starts there
    while the agent resends: the call completes exactly, and the agent logged the refusal
    and its end."""
    probe = UdpSwitch(port=0).start()
    address = probe.address
    probe.stop()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    job = JobConfig(job=4, workers=(WorkerAddr(0, *s.getsockname()),), nslots=2, nlanes=4,
                    block_size=64)
    x = np.arange(5000, dtype=np.int32)
    refusing = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if "refuses datagrams" in record.getMessage():
                refusing.set()
    seen = Seen()
    logging.getLogger("spina.agent").addHandler(seen)
    caplog.set_level(logging.WARNING, logger="spina.agent")
    got: dict = {}
    with Agent(job, 0, address, sock=s, timeout=30, rto=0.05) as agent:
        t = threading.Thread(target=lambda: got.update(out=agent.allreduce(x)))
        t.start()
        try:
            assert refusing.wait(10), "the agent never saw a refusal"
            with UdpSwitch(*address) as sw:  # the switch is back, the same port
                sw.add_job(job)
                t.join(30)
        finally:
            logging.getLogger("spina.agent").removeHandler(seen)
            t.join(30)
    assert (got["out"] == x).all()
    said = [r.getMessage() for r in caplog.records]
    assert any("answers again after refusing datagrams for" in m for m in said), said
