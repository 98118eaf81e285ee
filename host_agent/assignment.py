"""A host agent from the file written for one worker: the job file the launcher wrote
(spina.config.JobFile, `agent_from_env`: what a training process under torchrun calls) or the
assignment the controller wrote (`agents_dir/job<ID>-rank<R>.json`, spina.config.Assignment:
the job, the switch's address and the worker's rank; `connect`).

    >>> agent = connect("agents/job7-rank0.json")            # doctest: +SKIP
    >>> agent = agent_from_env()                             # doctest: +SKIP  ($SPINA_JOB_FILE)
    >>> total = agent.allreduce(np.ones(1000, np.float32))   # doctest: +SKIP

Neither imports torch: a DDP hook (host_agent.hooks) takes the agent they return.
"""
from __future__ import annotations

import os
import sys
import time

from host_agent import dlcp
from spina.config import Assignment, ConfigError, load_worker_file

JOB_FILE_ENV = "SPINA_JOB_FILE"
DAEMON_SOCKET_ENV = "SPINA_AGENT_SOCKET"
TIMEOUT_ENV = "SPINA_TIMEOUT"  # the agent's per-call timeout in seconds (agent_from_env)
DEFAULT_TIMEOUT = 30.0


def connect(path, **agent_kwargs):
    """A host agent for the assignment in `path` (keyword arguments go to Agent); with
    `$SPINA_METRICS` set it serves its metrics (host_agent/metrics.py)."""
    a = Assignment.load(path)
    return _agent(a.job, a.rank, a.switch, a.rendezvous, **agent_kwargs)


def _agent(job, rank, switch, rendezvous, **agent_kwargs):
    """An `Agent`; with `$SPINA_METRICS` set (read first: a bad address fails before any
    socket is bound) this process's agent serves its metrics there."""
    from host_agent.agent import Agent
    from host_agent.metrics import env_address
    where = env_address()
    agent = Agent(job, rank, switch, rendezvous=rendezvous, **agent_kwargs)
    if where is not None:
        agent.serve_metrics(where)
    return agent


def agent_from_env(job_file: str | None = None, rank: int | None = None, wait: float = 60.0,
                   timeout: float | None = None, rto: float = 0.2,
                   daemon_socket: str | None = None,
                   bounded_loss: float | None = None, priority_policy: str | None = None,
                   loss_tolerant_policy: str | None = None,
                   loss_deadline: float | str | None = None):
    """Create this rank's SpINA agent from the job file the launcher wrote.

    Args:
        job_file: path of the JSON job file (spina.config.JobFile), or of this rank's assignment
            (spina.config.Assignment: a two-level job's ranks each have one); default
            `$SPINA_JOB_FILE`. `{rank}` in it is this rank: one setting for every node of a
            multi-host torchrun names each rank's assignment
            (`/srv/spina/agents/job7-rank{rank}.json`).
        rank: this worker's rank; default `$RANK` as set by torchrun, else the initialised
            process group's rank.
        wait: seconds to wait for the file to appear (the launcher may still be starting).
        timeout: the agent's per-call timeout in seconds; default `$SPINA_TIMEOUT`, else
            30.
        rto: first retransmission timeout. Ranks reach a bucket tens of milliseconds apart
            (their backward passes drift), and a packet waiting at the switch for a slower
            rank is not lost: the agent's 5 ms default (recovery.MIN_RTO) would resend most
            of them.
        daemon_socket: go through the host's agent daemon at this Unix socket instead of an
            in-process agent; default `$SPINA_AGENT_SOCKET` (unset: in-process).
        bounded_loss, priority_policy, loss_tolerant_policy, loss_deadline: override the job
            file's DLCP settings for this rank (None: the file's; spina.config.JobConfig,
            docs/dlcp.md). 0 = exact. loss_deadline: seconds, or "auto" (twice the measured
            round latency, 2-50 ms). Every rank must pass the same. With a daemon, set them in the
            daemon's config instead (it owns the agent).

    Returns:
        An `Agent` bound to the job's address for `rank`, talking to the file's switch; or,
        with a daemon socket, a `host_agent.daemon.DaemonClient` attached to `rank` (same
        interface as far as the hook is concerned; timeout and rto are then the daemon's).

    Raises:
        ConfigError: no job file given, the file never appeared, its worker count differs
            from torchrun's `$WORLD_SIZE`, or `$SPINA_TIMEOUT` is not a positive number, or
            `$SPINA_METRICS` (an in-process agent's metrics at [HOST:]PORT + `$LOCAL_RANK`,
            host_agent/metrics.py) is not an address.

    Example:
        >>> agent = agent_from_env("/tmp/spina-job.json")  # doctest: +SKIP
        >>> agent.allreduce(np.ones(4, np.float32))         # doctest: +SKIP
    """
    job_file = job_file or os.environ.get(JOB_FILE_ENV)
    if not job_file:
        raise ConfigError(f"no job file: pass job_file or set ${JOB_FILE_ENV} "
                          "(python -m host_agent.launch writes one)")
    if timeout is None:
        timeout = timeout_from_env()
    if rank is None:
        # torch.distributed not imported: no process group can be initialised (and this
        # module stays free of torch for users of the agent alone)
        dist = sys.modules.get("torch.distributed")
        if "RANK" in os.environ:
            rank = int(os.environ["RANK"])
        elif dist is not None and dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
        else:
            raise ConfigError("rank unknown: pass rank, run under torchrun, or init the "
                              "process group")
    job_file = job_file.replace("{rank}", str(rank))
    deadline = time.monotonic() + wait
    while not os.path.exists(job_file):
        if time.monotonic() > deadline:
            raise ConfigError(f"job file {job_file} did not appear within {wait:g} s")
        time.sleep(0.05)
    jf = load_worker_file(job_file, rank)  # a job file, or a two-level job's assignment
    world = os.environ.get("WORLD_SIZE")
    if world is not None and int(world) != jf.job.nworkers:
        raise ConfigError(f"job file {job_file}: field 'job.workers': {jf.job.nworkers} workers, "
                          f"but torchrun's WORLD_SIZE is {world}")
    daemon_socket = daemon_socket or os.environ.get(DAEMON_SOCKET_ENV)
    overrides = {"bounded_loss": bounded_loss, "priority_policy": priority_policy,
                 "loss_tolerant_policy": loss_tolerant_policy, "loss_deadline": loss_deadline}
    if daemon_socket:
        given = [k for k, v in overrides.items() if v is not None]
        if given:
            raise ConfigError(f"field '{given[0]}': the agent daemon at {daemon_socket} owns "
                              "the agent: set it in the daemon's config")
        from host_agent.daemon import DaemonClient
        return DaemonClient(job_file, rank, daemon_socket)
    try:
        job = dlcp.with_policy(jf.job, **overrides)
    except ConfigError as e:
        raise ConfigError(f"agent_from_env: {e}") from None
    return _agent(job, rank, jf.switch, jf.rendezvous, timeout=timeout, rto=rto)


def timeout_from_env() -> float:
    """The per-call timeout `$SPINA_TIMEOUT` sets (seconds), else DEFAULT_TIMEOUT."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"${TIMEOUT_ENV}: {text!r} is not a positive number of seconds")
    return value


__all__ = ["connect", "agent_from_env", "timeout_from_env", "JOB_FILE_ENV", "DAEMON_SOCKET_ENV",
           "TIMEOUT_ENV", "DEFAULT_TIMEOUT"]
