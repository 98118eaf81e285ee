"""A host agent from the file the controller wrote for one worker
(`agents_dir/job<ID>-rank<R>.json`; its format is spina.config.Assignment: the job, the
switch's address and the worker's rank).

    >>> agent = connect("agents/job7-rank0.json")            # doctest: +SKIP
    >>> total = agent.allreduce(np.ones(1000, np.float32))   # doctest: +SKIP
"""
from __future__ import annotations

from spina.config import Assignment


def connect(path, **agent_kwargs):
    """A host agent for the assignment in `path` (keyword arguments go to Agent); with
    `$SPINA_METRICS` set it serves its metrics (host_agent/metrics.py)."""
    from host_agent.agent import Agent
    from host_agent.metrics import env_address
    a = Assignment.load(path)
    where = env_address()
    agent = Agent(a.job, a.rank, a.switch, rendezvous=a.rendezvous, **agent_kwargs)
    if where is not None:  # $SPINA_METRICS
        agent.serve_metrics(where)
    return agent
