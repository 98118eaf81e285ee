"""Loss on real interfaces: iptables drops packets in the hosts' namespaces (this kernel has no
netem), in both directions, and every all-reduce through the L2-mode switch is still exact.

Run just this file: python -m pytest tests/test_netns_loss.py   (needs root, `ip`, `iptables`)
"""
from __future__ import annotations

import shutil

import pytest

from spina import netns
from tests.netns import run_workers, workers_job


def _lossy(p: float):
    def setup(ns):
        if shutil.which("iptables") is None:
            pytest.skip("iptables not installed (scripts/setup.sh installs it)")
        netns.random_drop(ns, p)  # OUTPUT, INPUT: worker -> switch and switch -> worker
    return setup


@pytest.mark.parametrize("loss", [0.01, 0.05, 0.10])
@pytest.mark.parametrize("hosts", [3], indirect=True)
def test_exact_under_iptables_loss(hosts, loss):
    """With random loss in both directions at every host, int32 sums are exact and every rank
    gets bit-identical float sums."""
    job = workers_job(len(hosts))
    dropped = {}

    def setup(ns):
        _lossy(loss)(ns)
        dropped[ns] = 0
    outs, dp = run_workers(hosts, job, seed=int(loss * 100), n=20000, setup_ns=setup)
    assert all(o["ints_exact"] for o in outs), outs
    assert len({o["ints"] for o in outs}) == 1 and len({o["floats"] for o in outs}) == 1
    total_dropped = sum(netns.random_drops(ns) for ns, _ in hosts)
    assert total_dropped > 0, "iptables dropped nothing: the test would prove nothing"
    assert dp.counter("job_duplicates", job.job) > 0
