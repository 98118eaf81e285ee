"""PyTorch DDP communication hooks, one module per family (as torch's
torch.distributed.algorithms.ddp_comm_hooks), every hook named by one registry:

    dense.py       spina_allreduce_hook: every bucket summed by the switch as it is
    compressed.py  spina_compressed_hook (and gloo_compressed_hook, the control): a
                   compressor's blocks (host_agent.compression) summed by the switch
    votes.py       spina_vote_hook: sign or ternary votes summed exactly
    local_sgd.py   spina_local_sgd_hook with LocalSGDOptimizer: (post-)local SGD
    overlap.py     overlap_hook of PriorityOverlap: the next forward pass overlaps the
                   last step's communication, sent in priority order (PrioritySender)
    collective.py  collective_allreduce_hook: one of collectives.ALGORITHMS over gloo
    fsdp.py        shard_on_spina: an FSDP2 model's all-gather and reduce-scatter through
                   SpINA (FSDP's custom collectives, not a DDP hook)
    registry.py    HOOKS (name -> hook and state) and register_from_job (the hook a job
                   file's "communication" section names, built and registered)
    common.py      what the families share (HookCounters, sum_async, hook_future, fail,
                   pack_aligned, unpack_aligned, processes_summed)
    layout.py      a bucket's parameters on block boundaries (numpy only)

Every hook is `hook(state, bucket) -> torch.futures.Future[torch.Tensor]` with its state a
small class with `__slots__`. The names below load their module when first asked for, so
that the registry, the layout and the priority sender import no torch.

    from host_agent.assignment import agent_from_env
    from host_agent.hooks import SpinaHookState, spina_allreduce_hook
    model.register_comm_hook(SpinaHookState(agent_from_env()), spina_allreduce_hook)
"""
from __future__ import annotations

from spina.lazy import lazy_names

# module -> its public names (its __all__; tests/test_comm_hooks.py checks the two agree)
_MODULES = {
    "dense": ("SpinaHookState", "spina_allreduce_hook"),
    "compressed": ("CompressionHookState", "check_single_momentum", "bucket_layout",
                   "spina_compressed_hook", "gloo_compressed_hook"),
    "votes": ("VoteHookState", "spina_vote_hook"),
    "local_sgd": ("LocalSGDState", "LocalSGDOptimizer", "spina_local_sgd_hook"),
    "overlap": ("PrioritySender", "PriorityOverlap", "overlap_hook", "TraceEvent", "lane_span",
                "slot_exponents", "ORDERS", "DEFAULT_CHUNK"),
    "collective": ("CollectiveHookState", "collective_allreduce_hook"),
    "fsdp": ("FSDPCounters", "SpinaAllGather", "SpinaReduceScatter", "fsdp_modules",
             "shard_on_spina"),
    "registry": ("HOOKS", "HookType", "RegisteredHook", "communication_of", "hook_for",
                 "register_from_job"),
    "common": ("HookCounters", "processes_summed", "sum_async", "hook_future", "fail",
               "pack_aligned", "unpack_aligned"),
    "layout": ("block_aligned_layout", "segment_sizes"),
}
_OWNERS = {name: module for module, names in _MODULES.items() for name in names}

__getattr__, __dir__ = lazy_names(__name__, _OWNERS, globals())

__all__ = list(_OWNERS)
