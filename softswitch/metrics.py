"""The software switch's Prometheus exporter (`--metrics HOST:PORT`).

Nothing happens per packet: the collector reads the counters the data path keeps anyway
(Pipeline.counters, numpy arrays indexed by job and port, and the socket totals of UdpSwitch /
L2Switch) when Prometheus scrapes. Names: spina/metrics.py (P4 counters, shared with the
controller's exporter) plus

    spina_switch_packets_received_total / _sent_total    datagrams (UDP) or frames (L2)
    spina_switch_bytes_received_total / _sent_total      UDP payload bytes (UDP mode only)
    spina_switch_pool_slots                              slots in the register pool
    spina_switch_slots_in_use                            slots of the pool the admitted jobs hold
    spina_job_slots{job_id}                              one job's share of the pool
    spina_job_workers{job_id}                            its admitted ranks
"""
from __future__ import annotations

import numpy as np

from spina.metrics import MetricsServer, counter_families
from spina.spec import JOB_COUNTERS, PORT_COUNTERS


class SwitchCollector:
    """A prometheus_client collector over one software switch's live counters.

    Args:
        pipeline: the switch's Pipeline.
        sw: the UdpSwitch or L2Switch around it (socket totals), or None.
    """

    def __init__(self, pipeline, sw=None):
        self.pipeline = pipeline
        self.sw = sw

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        p = self.pipeline
        with p.lock:  # admission changes under this lock; a copy is enough
            admitted = list(p.admission.values())
        jobs = {a.job: a for a in admitted}
        c = p.counters
        job_ids = set(jobs)
        for name in JOB_COUNTERS:  # jobs that left keep their counts until reset
            job_ids.update(np.flatnonzero(c[name]).tolist())
        port_ids = {0} if hasattr(self.sw, "packets_in") else set()
        port_ids.update(getattr(self.sw, "interfaces", {}))
        for name in PORT_COUNTERS:
            port_ids.update(np.flatnonzero(c[name]).tolist())
        yield from counter_families([(
            {}, {j: {n: int(c[n][j]) for n in JOB_COUNTERS} for j in job_ids},
            {q: {n: int(c[n][q]) for n in PORT_COUNTERS} for q in port_ids})])

        sw = self.sw
        pairs = [("packets_in", "packets_out", "packets", "Datagrams"),
                 ("bytes_in", "bytes_out", "bytes", "UDP payload bytes"),
                 ("frames_in", "frames_out", "packets", "Frames")]
        for rx, tx, unit, what in pairs:
            if sw is not None and hasattr(sw, rx):
                yield CounterMetricFamily(f"spina_switch_{unit}_received",
                                          f"{what} the switch received.", value=getattr(sw, rx))
                yield CounterMetricFamily(f"spina_switch_{unit}_sent",
                                          f"{what} the switch sent.", value=getattr(sw, tx))
        if sw is not None and hasattr(sw, "send_errors"):
            yield CounterMetricFamily("spina_switch_send_errors",
                                      "Datagrams the switch could not send (send buffer full, "
                                      "address unreachable): lost, the agents resend.",
                                      value=sw.send_errors)
        yield GaugeMetricFamily("spina_switch_pool_slots", "Slots in the register pool.",
                                value=p.pool_slots)
        # An admission entry per (job, rank): one slot range per job.
        ranges = {a.job: (a.slot_base, a.nslots) for a in admitted}
        yield GaugeMetricFamily("spina_switch_slots_in_use",
                                "Pool slots held by the admitted jobs.",
                                value=sum(n for _, n in ranges.values()))
        slots = GaugeMetricFamily("spina_job_slots", "Pool slots a job holds.", labels=["job_id"])
        workers = GaugeMetricFamily("spina_job_workers", "Workers a job admits.", labels=["job_id"])
        for j, a in sorted(jobs.items()):
            slots.add_metric([str(j)], a.nslots)
            workers.add_metric([str(j)], a.nworkers)
        yield slots
        yield workers


def serve_metrics(pipeline, sw, address: str) -> MetricsServer:
    """Start the /metrics endpoint of one switch on `address` (HOST:PORT, loopback default)."""
    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    registry.register(SwitchCollector(pipeline, sw))
    return MetricsServer(registry, address)
