"""DLCP on the host: each packet's priority and loss-tolerant flag (docs/dlcp.md).

SGD tolerates losing a small part of a gradient, and a layer's gradient is needed when the
next forward pass reaches that layer. So, per packet of one all-reduce call:

  priority        policy "fixed": the job's `priority` (every packet in one queue, as before).
                  policy "layer": from the call's layer position, the job's `priority` for the
                  layers needed last by the next forward pass up to 7 for those needed first
                  (in DDP the LAST bucket holds the FIRST layers: the most urgent).
  loss-tolerant   policy "none": never. Policy "magnitude": the packets whose largest |x| is
                  smallest, while their blocks fit the call's budget; such packets go in the
                  job's `priority` queue (the lowest of the job), where the switch may drop
                  them under congestion, and a round missing one completes as PARTIAL.

The budget is counted in blocks: the job's bound (`bounded_loss`) is defined on blocks (the
fraction of a call's blocks that may be completed without every worker), which is also what
the agents' flush budget and the switch count, and every block carries the same payload
(4 * block_size bytes), so a fraction of blocks is the same fraction of gradient bytes.
Each worker chooses its blocks from its own magnitudes, so different workers may choose
different positions: each worker gets 1/nworkers of the bound, and the positions all of them
chose together are at most `bounded_loss` of the blocks the call aggregates.

Never loss-tolerant: setup rounds (they agree the exponent every worker quantizes with),
int32 calls (exact by contract), blocks holding NaN/Inf (they must reach every rank), and
packets with no block (their next positions alone carry nothing to lose).

What is decided here, per call, once: per block of the agent's lane plan whether it may be
dropped, and the call's two priorities. Per packet the agent asks `packet_class` before it
fills the packet (host_agent/agent.py, `_next_round`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from host_agent.blocks import LanePlan
from spina import wire
from spina.config import ConfigError, JobConfig

TOP_PRIORITY = 7  # the switch's highest queue (v1model priority is 3 bits)


def with_policy(job: JobConfig, bounded_loss: float | None = None,
                priority_policy: str | None = None, loss_tolerant_policy: str | None = None,
                loss_deadline: float | str | None = None) -> JobConfig:
    """`job` with the DLCP settings that are not None replaced (a training process's or a
    daemon's override of its job file), validated: ConfigError naming the field. Every rank
    of a job must use the same settings (the bound is the job's; see docs/dlcp.md)."""
    changes = {k: v for k, v in (("bounded_loss", bounded_loss),
                                 ("priority_policy", priority_policy),
                                 ("loss_tolerant_policy", loss_tolerant_policy),
                                 ("loss_deadline", loss_deadline)) if v is not None}
    if "bounded_loss" in changes and (isinstance(bounded_loss, bool)
                                      or not isinstance(bounded_loss, (int, float))):
        raise ConfigError(f"field 'bounded_loss': {bounded_loss!r} is not a number")
    for k in ("priority_policy", "loss_tolerant_policy"):
        if k in changes and not isinstance(changes[k], str):
            raise ConfigError(f"field '{k}': {changes[k]!r} is not a string")
    return dataclasses.replace(job, **changes).validate() if changes else job


def layer_priority(base: int, layer: tuple[int, int] | None) -> int:
    """The priority of a call holding the `layer` = (i, n)-th of n groups of layers in the
    order the next forward pass needs them (0: needed first): spread evenly (rounded) from 7
    for the first group down to `base` for the last. None (unknown) or one group: `base`."""
    if layer is None:
        return base
    i, n = layer
    if n <= 1:
        return base
    return base + ((n - 1 - i) * (TOP_PRIORITY - base) * 2 + n - 1) // (2 * (n - 1))


def check_layer(layer) -> tuple[int, int] | None:
    """`layer` as a validated (i, n) pair, 0 <= i < n; ValueError naming it otherwise."""
    if layer is None:
        return None
    try:
        i, n = (int(v) for v in layer)
    except (TypeError, ValueError):
        raise ValueError(f"layer: {layer!r} is not a pair (index, count)") from None
    if not 0 <= i < n:
        raise ValueError(f"layer: index {i} outside 0..{n - 1} (count {n})")
    return i, n


def budget_blocks(bounded_loss: float, nblocks: int, nworkers: int) -> int:
    """How many of its `nblocks` blocks one worker may mark droppable: its 1/nworkers share of
    the bound, rounded down (so every worker's together never exceed the bound)."""
    return int(np.floor(bounded_loss * nblocks / nworkers + 1e-9))


def droppable_blocks(magnitude: np.ndarray, packet: np.ndarray, budget: int) -> np.ndarray:
    """Which blocks may be dropped: whole packets, smallest first, while they fit `budget`.

    Args:
        magnitude: per block, its largest |x| (any monotone measure: float32 bits do);
            a block that must never be dropped has the dtype's maximum.
        packet: per block, the packet that carries it (ints; any labels).
        budget: most blocks to mark.

    Returns:
        bool per block. A packet is marked whole or not at all (a packet goes on the wire
        whole), by its largest block, ascending, ties by label; the marked blocks are the
        longest such prefix whose blocks fit `budget`.
    """
    out = np.zeros(len(magnitude), bool)
    if budget <= 0 or not len(magnitude):
        return out
    labels, inverse, sizes = np.unique(packet, return_inverse=True, return_counts=True)
    peak = np.full(len(labels), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(peak, inverse, magnitude.astype(np.int64))
    never = np.int64(np.iinfo(magnitude.dtype).max)
    order = np.lexsort((labels, peak))  # smallest peak first, then by label
    fits = np.cumsum(sizes[order]) <= budget
    chosen = np.zeros(len(labels), bool)
    chosen[order[fits]] = peak[order[fits]] < never
    return chosen[inverse]


@dataclass
class CallClasses:
    """The classification of one call at one worker.

    priority: of the call's packets that must arrive; tolerant_priority: of its loss-tolerant
    ones. droppable: per entry of the agent's `pos_ext` (its plan's blocks lane by lane, each
    lane followed by a sentinel), whether the block may be dropped; None: none may.
    """
    priority: int
    tolerant_priority: int
    droppable: np.ndarray | None = None
    marked_blocks: int = 0  # blocks marked droppable (the budget they used)

    def packet_class(self, pos_ext: np.ndarray, ptr: np.ndarray, pos: np.ndarray
                     ) -> tuple[int, int]:
        """(priority, extra flags) of the packet a worker sends for a round at positions
        `pos` (one per lane), its lanes' next own blocks at `ptr` in `pos_ext` (the agent's
        state before it fills the packet): the packet carries the blocks where
        pos_ext[ptr] == pos, and is loss-tolerant if it carries any and every one of them
        may be dropped. The default policies cost one attribute test."""
        d = self.droppable
        if d is None:
            return self.priority, 0
        rows = ptr[pos_ext[ptr] == pos]
        if len(rows) and d[rows].all():
            return self.tolerant_priority, wire.FLAG_LOSS_TOLERANT
        return self.priority, 0


def classify(job: JobConfig, plan: LanePlan, magnitude: np.ndarray | None,
             never: np.ndarray | None, layer: tuple[int, int] | None,
             flusher: bool = False) -> CallClasses:
    """The classes of one call's packets.

    Args:
        job: the job (its priority, bounded_loss and policies).
        plan: the worker's lane plan of the call (host_agent/blocks.py).
        magnitude: per plan row, the block's largest |x| as float32 bits (None: an int32 call,
            never droppable).
        never: per plan row, True for blocks that must not be dropped (NaN/Inf), or None.
        layer: the call's (i, n) layer position (layer_priority), or None.
        flusher: this worker is the call's one flusher (host_agent/recovery.py flusher_rank):
            it marks nothing, since a round missing only its contribution cannot be flushed.
    """
    prio = job.priority
    if job.priority_policy == "layer":
        prio = layer_priority(job.priority, layer)
    classes = CallClasses(prio, job.priority)
    if job.loss_tolerant_policy == "none" or magnitude is None or not len(plan.pos) or flusher:
        return classes
    budget = budget_blocks(job.bounded_loss, len(plan.pos), job.nworkers)  # of what it sends
    if budget <= 0:
        return classes
    # The packet a block travels in when every worker has the same blocks (a dense region):
    # slot s's i-th round carries the i-th block of each of its lanes.
    per_lane = np.diff(plan.lane_bounds)
    lane = np.repeat(np.arange(len(per_lane)), per_lane)
    index_in_lane = np.arange(len(plan.pos)) - plan.lane_bounds[lane]
    packet = (lane // plan.nlanes) * (int(per_lane.max()) + 1) + index_in_lane
    mag = magnitude.astype(np.int32, copy=True)
    if never is not None:
        mag[never.astype(bool)] = np.iinfo(np.int32).max  # bool or 0/1 bytes
    rows = droppable_blocks(mag, packet, budget)
    # into the agent's pos_ext layout: each lane's rows shifted by the sentinels before it
    ext = np.zeros(len(plan.pos) + len(per_lane), bool)
    ext[np.arange(len(plan.pos)) + lane] = rows
    classes.droppable = ext if rows.any() else None
    classes.marked_blocks = int(np.count_nonzero(rows))
    return classes


__all__ = ["CallClasses", "classify", "with_policy", "droppable_blocks", "budget_blocks",
           "layer_priority", "check_layer", "TOP_PRIORITY"]
