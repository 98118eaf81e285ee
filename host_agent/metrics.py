"""The host agents' Prometheus metrics: the daemon's (`--metrics [HOST:]PORT` or config
`metrics`) and an in-process agent's (the DDP hook's, `assignment.connect`'s: `Agent.serve_metrics`,
or `$SPINA_METRICS=[HOST:]PORT` for every agent `agent_from_env` and `connect` make; under
torchrun each process serves at PORT + `$LOCAL_RANK`, so the ranks of one host do not clash).

Updated once per call from the agent's CallStats (never per packet). Labels: job_id, rank.

    spina_agent_calls_total{job_id,rank,outcome}     outcome: ok | error
    spina_agent_call_duration_seconds{job_id}        histogram of all-reduce call latency
    spina_agent_calls_in_progress                    calls running now
    spina_agent_packets_sent_total / _received_total
    spina_agent_bytes_sent_total / _received_total   whole UDP payloads
    spina_agent_payload_bytes_sent_total             block data only
    spina_agent_resends_total                        retransmissions after a timeout
    spina_agent_foreign_packets_total                datagrams not from the switch, dropped
    spina_agent_malformed_packets_total              the switch's datagrams failing header checks
    spina_agent_partial_rounds_total                 rounds completed without every worker
    spina_agent_blocks_lost_total                    own blocks missing from the sums (bounded loss)
    spina_agent_loss_tolerant_packets_total          packets sent flagged loss-tolerant (DLCP)
    spina_agent_nonzero_blocks_total                 blocks this rank put on the wire
    spina_agent_elements_total                       tensor elements reduced
    spina_agent_agents                               (job, rank) agents the daemon holds
    spina_agent_clients_lost_total                   clients gone during a call

The all-gather's calls (Agent.allgather, the daemon's allgather op) are counted the same way,
once per call from its GatherStats, under spina_agent_gather_*:

    spina_agent_gather_calls_total{job_id,rank,outcome}
    spina_agent_gather_call_duration_seconds{job_id}
    spina_agent_gather_packets_sent_total / _received_total, _bytes_sent_total / _received_total
    spina_agent_gather_shard_bytes_total             bytes of this rank's shards gathered
    spina_agent_gather_requests_total                chunks re-requested from their owners
    spina_agent_gather_resends_total                 own chunks sent again on a request
    spina_agent_gather_duplicates_total              chunks received twice
    spina_agent_gather_foreign_packets_total / _malformed_packets_total
"""
from __future__ import annotations

import os

from spina.metrics import MetricsServer, parse_address

METRICS_ENV = "SPINA_METRICS"  # [HOST:]PORT: in-process agents serve their metrics there

# Each call's counters, one row a counter of both ops where their stats share the field:
# (stats field, metric name after the op's prefix (without _total), the all-reduce's help
# (CallStats), the all-gather's (GatherStats)); None: that op's stats have no such field.
_COUNTERS = (
    ("packets_sent", "packets_sent", "INA packets sent, resends included.",
     "All-gather packets sent: chunks, their resends and requests."),
    ("packets_received", "packets_received", "Result packets taken from the switch.",
     "All-gather packets taken from the switch."),
    ("bytes_sent", "bytes_sent", "UDP payload bytes sent.", "All-gather UDP payload bytes sent."),
    ("bytes_received", "bytes_received", "UDP payload bytes received.",
     "All-gather UDP payload bytes received."),
    ("payload_bytes_sent", "payload_bytes_sent", "Block data bytes sent.", None),
    ("shard_bytes", "shard_bytes", None, "Bytes of this rank's shards gathered."),
    ("requests", "requests", None,
     "Chunks re-requested from their owners (one request packet each)."),
    ("resends", "resends", "Packets sent again after a timeout.",
     "Own chunks sent again because a rank asked."),
    ("duplicates", "duplicates", None, "Chunks received a second time."),
    ("foreign_packets", "foreign_packets", "Datagrams from anyone but the switch, dropped unread.",
     "Datagrams from anyone but the switch during an all-gather, dropped."),
    ("malformed_packets", "malformed_packets",
     "Datagrams from the switch failing the header checks, dropped.",
     "All-gather datagrams failing the header checks, dropped."),
    ("partial_rounds", "partial_rounds",
     "Rounds the switch completed without every worker (bounded loss).", None),
    ("blocks_lost", "blocks_lost",
     "This rank's blocks missing from the sums: sent in a round completed without it, or "
     "skipped by one (bounded loss).", None),
    ("loss_tolerant_packets", "loss_tolerant_packets",
     "Packets sent flagged loss-tolerant (DLCP, host_agent/dlcp.py).", None),
    ("nonzero_blocks", "nonzero_blocks", "Non-zero blocks this rank sent.", None),
    ("length", "elements", "Tensor elements reduced.", None),
)
# op -> (its metrics' prefix, its name in the help, its help column in _COUNTERS)
_OPS = {"allreduce": ("spina_agent", "All-reduce", 2),
        "allgather": ("spina_agent_gather", "All-gather", 3)}
# Call latency: loopback calls of a few KB take ~1 ms, 100 MB tensors seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)


class AgentMetrics:
    """One daemon's or one in-process agent's metrics, in a registry of its own (two in one
    process stay apart)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = CollectorRegistry()
        labels = ("job_id", "rank")
        # op -> (calls by outcome, the per-call counters, latency): the all-reduce's series
        # and the all-gather's, the same shapes under two prefixes
        self.ops = {}
        for op, (prefix, what, col) in _OPS.items():
            self.ops[op] = (
                Counter(f"{prefix}_calls", f"{what} calls served, by outcome.",
                        labels + ("outcome",), registry=self.registry),
                {row[0]: Counter(f"{prefix}_{row[1]}", row[col], labels, registry=self.registry)
                 for row in _COUNTERS if row[col] is not None},
                Histogram(f"{prefix}_call_duration_seconds", f"{what} call latency.",
                          ("job_id",), buckets=LATENCY_BUCKETS, registry=self.registry))
        self.in_progress = Gauge("spina_agent_calls_in_progress", "Calls running now.",
                                 registry=self.registry)
        self.agents = Gauge("spina_agent_agents", "(job, rank) agents the daemon holds.",
                            registry=self.registry)
        self.clients_lost = Counter("spina_agent_clients_lost",
                                    "Clients that went away during a call.",
                                    registry=self.registry)

    def call_done(self, job: int, rank: int, stats, seconds: float, ok: bool,
                  op: str = "allreduce") -> None:
        """Count one finished call of `op` (allreduce: CallStats, allgather: GatherStats): its
        stats (ok) or only its outcome (error)."""
        calls, per_call, latency = self.ops[op]
        j, r = str(job), str(rank)
        calls.labels(j, r, "ok" if ok else "error").inc()
        latency.labels(j).observe(seconds)
        if ok:
            for f, counter in per_call.items():
                counter.labels(j, r).inc(getattr(stats, f))

    def serve(self, address: str) -> MetricsServer:
        return MetricsServer(self.registry, address)


def env_address() -> str | None:
    """Where `$SPINA_METRICS` says this process's agent serves its metrics: HOST:PORT with
    `$LOCAL_RANK` (torchrun's; 0 if unset) added to the port; None when it is unset. A bad
    value is a ConfigError naming the variable."""
    from spina.config import ConfigError
    text = os.environ.get(METRICS_ENV)
    if not text:
        return None
    try:
        host, port = parse_address(text)
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise ConfigError(f"${METRICS_ENV}: {e}") from None
    if not 0 < port + local < 1 << 16:
        raise ConfigError(f"${METRICS_ENV}: port {port} + LOCAL_RANK {local} is not a TCP port")
    return f"{host}:{port + local}"

