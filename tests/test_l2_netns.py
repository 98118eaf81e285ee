"""Integration: host agents in network namespaces, the software switch in L2 mode between them.

Run just this file: python -m pytest tests/test_l2_netns.py   (needs root and `ip`)

Each worker is a namespace with one veth to the switch (raw sockets in this process); the
agents run as separate processes and all-reduce through the switch by Ethernet frames. The
test removes every namespace, link and process it created.
"""
from __future__ import annotations

import pytest

from tests.netns import run_workers, workers_job


@pytest.mark.parametrize("hosts", [3], indirect=True)
def test_agents_allreduce_through_l2_switch(hosts):
    """Three agents in namespaces get exact int32 sums and identical float sums via L2 mode."""
    job = workers_job(len(hosts))
    outs, dp = run_workers(hosts, job)
    assert all(o["ints_exact"] for o in outs), outs
    assert len({o["ints"] for o in outs}) == 1
    assert len({o["floats"] for o in outs}) == 1  # every rank bit-identical
    assert max(o["float_err"] for o in outs) < 1e-3
    assert dp.counter("job_results", job.job) > 0
    assert dp.counter("port_unadmitted", 1) == 0
