"""The experiment's configurations (SpINA's loss bound and priority policies, and gloo) and
the columns of its CSVs."""
from __future__ import annotations

from dataclasses import dataclass

JOB = 1  # the one job on the fabric (the leaf counts its drops, the aggregator admits it)


@dataclass(frozen=True)
class Config:
    """One configuration of the experiment."""
    name: str
    method: str                   # "spina" or "gloo"
    bounded_loss: float = 0.0
    priority_policy: str = "fixed"
    loss_tolerant_policy: str = "none"
    priority: int = 0             # the job's priority (queue); background traffic is in 0
    loss_deadline: float | str | None = None  # None: --loss-deadline


CONFIGS = (Config("exact/fixed", "spina"), Config("exact/layer", "spina", priority_policy="layer"),
           # a control: every packet in a queue of its own, apart from the background's
           Config("exact/own-queue", "spina", priority=1),
           Config("b1%/fixed", "spina", 0.01, "fixed", "magnitude"),
           Config("b1%/layer", "spina", 0.01, "layer", "magnitude"),
           Config("b10%/fixed", "spina", 0.1, "fixed", "magnitude"),
           Config("b10%/layer", "spina", 0.1, "layer", "magnitude"),
           Config("gloo", "gloo"),
           # the loss deadline from the measured round latency (JobConfig loss_deadline auto)
           *(Config(f"b{b:.0%}/{pol}/auto", "spina", b, pol, "magnitude", loss_deadline="auto")
             for b in (0.01, 0.1) for pol in ("fixed", "layer")))
DEFAULT_CONFIGS = tuple(c.name for c in CONFIGS)
STEP_COLUMNS = ("repeat", "order", "config", "step_s", "wrong_step", "worker_max_s",
                "worker_min_s",
                "blocks", "blocks_lost", "wrong_blocks", "partial_rounds",
                "loss_tolerant_packets", "resends", "timeout_resends", "loss_deadline_ms",
                "congestion_drops",
                "congestion_seen", "tail_drops", "load1")
COLUMNS = ("config", "method", "bounded_loss", "priority_policy", "loss_tolerant_policy",
           "workers", "elements", "layers", "steps", "median_s", "p90_s", "p99_s", "min_s",
           "max_s", "spread_p99_over_median", "p99_vs_exact_fixed", "blocks_per_step",
           "blocks_lost_per_call", "blocks_lost_max_per_call", "wrong_blocks_per_call",
           "wrong_blocks_max_per_call", "bound_blocks_per_call", "partial_rounds_per_step",
           "loss_tolerant_packets_per_step", "resends_per_step", "loss_deadline_ms",
           "congestion_drops_per_step",
           "tail_drops_per_step", "load_min", "load_max", "within_bound", "verified")

TRAIN_COLUMNS = ("config", "step", "seconds", "test_accuracy")
TRAIN_SUMMARY = ("config", "steps", "seconds", "final_accuracy", "target_accuracy",
                 "seconds_to_target", "steps_to_target", "blocks_lost", "partial_rounds",
                 "congestion_drops", "weights_identical", "load_min", "load_max")
