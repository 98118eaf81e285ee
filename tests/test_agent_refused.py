"""A stopped switch fails a call at once (issue 30 item 5, the agent's part).

    python -m pytest -q tests/test_agent_refused.py

On loopback a datagram to a closed UDP port comes back as ICMP port unreachable; the agent's
socket reports it (IP_RECVERR), and a port that keeps refusing for REFUSED_GRACE with no answer
in between fails the call naming the switch's address, instead of after the call's timeout.
"""
import socket

import numpy as np
import pytest

from host_agent.agent import Agent, SpinaError, SpinaTimeout
from softswitch.udp import UdpSwitch
from spina.config import JobConfig, WorkerAddr


def test_a_stopped_switch_fails_the_call_naming_its_address():
    """A switch that stopped: the call raises SpinaError naming host:port long before its
    60 s timeout could (a SpinaTimeout), and the agent's next call does the same."""
    sw = UdpSwitch(port=0).start()
    host, port = sw.address
    sw.stop()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    job = JobConfig(job=4, workers=(WorkerAddr(0, *s.getsockname()),
                                    WorkerAddr(1, "127.0.0.1", 9)))
    with Agent(job, 0, (host, port), sock=s, timeout=60.0) as agent:
        for call in (1, 2):
            with pytest.raises(SpinaError, match=f"job 4 call {call}: the switch at "
                               f"{host}:{port} refused every datagram") as e:
                agent.allreduce(np.ones(5000, np.float32))
            assert not isinstance(e.value, SpinaTimeout)
            assert "nothing listens on that port" in str(e.value)
        assert agent.last_stats.packets_received == 0

