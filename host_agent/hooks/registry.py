"""Every DDP hook of this package by name (`HOOKS`, as torch's DDPCommHookType), and the one
a job file names, built and registered in one call:

    agent = agent_from_env()                                   # the job file's agent
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    comm = register_from_job(model, agent, opt)                # the job file's "communication"
    opt = comm.optimizer                                       # local SGD wraps it: step this one

The section (spina.communication.Communication) picks one of four (`hook_for`): dense SpINA
(`spina_allreduce_hook`), a compressor (`spina_compressed_hook`), a vote (`spina_vote_hook`)
or local SGD (`spina_local_sgd_hook` with `LocalSGDOptimizer`); the others (the gloo
control, priority overlap, the host collectives) are registered by hand. This module only
chooses and wires them, each hook's state checks its own arguments as when registered by
hand. It imports no torch: a hook's module (and torch) loads when `HookType.load` is called.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from host_agent.assignment import JOB_FILE_ENV
from spina.communication import VOTES, Communication
from spina.config import ConfigError, load_worker_file


@dataclass(frozen=True)
class HookType:
    """One hook of the registry: its name, and the module of host_agent.hooks (its family)
    that defines the hook function and its state class, by their names there."""
    name: str
    module: str
    hook: str
    state: str

    def load(self) -> tuple:
        """(hook function, state class), importing the family's module now."""
        m = importlib.import_module(f"{__package__}.{self.module}")
        return getattr(m, self.hook), getattr(m, self.state)


HOOKS = {t.name: t for t in (
    HookType("dense", "dense", "spina_allreduce_hook", "SpinaHookState"),
    HookType("compressed", "compressed", "spina_compressed_hook", "CompressionHookState"),
    HookType("gloo_compressed", "compressed", "gloo_compressed_hook", "CompressionHookState"),
    HookType("votes", "votes", "spina_vote_hook", "VoteHookState"),
    HookType("local_sgd", "local_sgd", "spina_local_sgd_hook", "LocalSGDState"),
    HookType("overlap", "overlap", "overlap_hook", "PriorityOverlap"),
    HookType("collective", "collective", "collective_allreduce_hook", "CollectiveHookState"),
)}


def hook_for(communication: Communication) -> HookType:
    """The registry's hook for a job file's "communication" section."""
    if communication.local_sgd is not None:
        return HOOKS["local_sgd"]
    if communication.compression is None:
        return HOOKS["dense"]
    return HOOKS["votes" if communication.method in VOTES else "compressed"]


@dataclass
class RegisteredHook:
    """What `register_from_job` registered, and what the training script must use.

    communication: the section it followed. kind: its `HookType` in `HOOKS`. hook, state: the
    hook function and its state (the state's counters: bytes, rounds, ...). optimizer: the
    optimiser to step, zero and schedule: with local SGD a `LocalSGDOptimizer` wrapping the
    one given (stepping the original would never average the weights), otherwise the one
    given (or None).
    """
    communication: Communication
    kind: HookType
    hook: object
    state: object
    optimizer: object = None

    def close(self) -> None:
        """Release the hook's own resources (the votes' thread); call after training."""
        close = getattr(self.state, "close", None)
        if close is not None:
            close()


def communication_of(agent, job_file: str | None = None) -> Communication:
    """The "communication" section of the job file `agent` was made from (`job_file`, default
    `$SPINA_JOB_FILE`, `{rank}` replaced by the agent's rank); no section: dense.

    Raises:
        ConfigError: no job file is known, it is not valid, or it names another job."""
    path = job_file or os.environ.get(JOB_FILE_ENV)
    if not path:
        raise ConfigError(f"no job file: pass job_file or communication, or set ${JOB_FILE_ENV}")
    jf = load_worker_file(path.replace("{rank}", str(agent.rank)), agent.rank)
    if jf.job.job != agent.job.job:
        raise ConfigError(f"job file {path}: field 'job.job': job {jf.job.job}, but the agent "
                          f"is in job {agent.job.job}")
    return jf.communication or Communication()


def register_from_job(model, agent, optimizer=None, communication=None,
                      job_file: str | None = None) -> RegisteredHook:
    """Build the hook the job file's "communication" section names and register it on `model`.

    Args:
        model: the `DistributedDataParallel` model (nothing registered on it yet).
        agent: this rank's agent (`host_agent.assignment.agent_from_env`).
        optimizer: the training's optimiser. Required for local SGD (it is wrapped); with a
            compressor's or vote's `momentum`, checked to have none of its own.
        communication: a `Communication` or its JSON mapping, instead of the job file's.
        job_file: where to read the section (default `$SPINA_JOB_FILE`, as agent_from_env).

    Returns:
        A `RegisteredHook`. **Use its `optimizer`** from then on: with local SGD it is the
        `LocalSGDOptimizer` that averages the weights every H steps; otherwise the optimiser
        given. Call its `close()` after training (the votes' hook has a thread).

    Raises:
        ConfigError: naming the field: the section is invalid; votes on a job with narrow lanes
            (`Communication.check_lanes`); local SGD without an optimizer; a compressor's
            momentum with an optimiser that has momentum too (`check_single_momentum`). The
            compressor is made with the job's block_size, so the two cannot disagree.

    Example (under torchrun, a job file from `python -m host_agent launch --communication
    '{"method": "topk", "ratio": 0.01}'`):
        >>> comm = register_from_job(model, agent_from_env(), opt)  # doctest: +SKIP
        >>> opt = comm.optimizer                                    # doctest: +SKIP
    """
    if communication is None:
        communication = communication_of(agent, job_file)
    elif isinstance(communication, dict):
        communication = Communication.from_dict(communication)
    communication.check_lanes(agent.job.lane_bits)
    kind = hook_for(communication)
    if kind.name == "local_sgd" and optimizer is None:
        raise ConfigError("communication.local_sgd: register_from_job needs the optimizer "
                          "(local SGD wraps it to average the weights)")
    hook, state_class = kind.load()
    if kind.name == "local_sgd":
        from host_agent.hooks.local_sgd import LocalSGDOptimizer
        local = communication.local_sgd
        state = state_class(agent, local.period, local.warmup_steps)
        optimizer = LocalSGDOptimizer(optimizer, state)
    elif kind.name == "dense":
        state = state_class(agent)
    else:  # a compressor or a vote: made with the job's blocks, so the two cannot disagree
        from host_agent.compression import make_compressor
        compressor = make_compressor(communication.compression, block_size=agent.job.block_size)
        state = state_class(compressor, agent, optimizer=optimizer)
    model.register_comm_hook(state, hook)
    return RegisteredHook(communication, kind, hook, state, optimizer)


__all__ = ["HOOKS", "HookType", "RegisteredHook", "communication_of", "hook_for",
           "register_from_job"]
