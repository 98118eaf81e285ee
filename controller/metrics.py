"""The controller's Prometheus exporter: polls the P4 counters of every switch of the desired
state over P4Runtime when Prometheus scrapes (`--metrics [HOST:]PORT` with `serve` or
`deploy --watch`), so BMv2 and Tofino switches get the same metrics as the software switch.

Names: spina/metrics.py (spina_job_*_total{job_id,switch}, spina_port_drops_total{port,cause,
switch}), plus

    spina_controller_switch_up{switch}    1 if the switch answered the last poll and runs a pipeline
    spina_job_slots{job_id,switch}        the desired state's slot share of each job
"""
from __future__ import annotations

import logging

from controller.p4rt import P4RuntimeError
from spina.metrics import MetricsServer, counter_families

log = logging.getLogger("spina.controller")


class ControllerCollector:
    """Reads every switch's job and port counters through a Controller at scrape time."""

    def __init__(self, ctl):
        self.ctl = ctl

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        up = GaugeMetricFamily("spina_controller_switch_up",
                               "1 if the switch answered the last poll and runs a pipeline.",
                               labels=["switch"])
        slots = GaugeMetricFamily("spina_job_slots", "Pool slots a job holds.",
                                  labels=["job_id", "switch"])
        sources = []
        with self.ctl.lock:  # never between a reconcile's writes
            state = self.ctl.state
            for name, sw in state.switches.items():
                jobs = state.jobs_on(sw)
                for j in jobs:
                    slots.add_metric([str(j.id), name], j.nslots)
                try:
                    s = self.ctl.session(name)
                    ok = s.attach()
                    if ok:
                        jc = s.job_counters([j.id for j in jobs])
                        pc: dict[int, dict[str, int]] = {p: {} for p in sw.ports}
                        for c in (s.ina_check, s.admission):
                            for counter, vals in c.read_counters(list(sw.ports)).items():
                                for p in sw.ports:
                                    pc[p][counter] = vals.get(p, 0)
                        sources.append(({"switch": name}, jc, pc))
                except (P4RuntimeError, OSError) as e:
                    log.warning("metrics: switch %s: %s", name, e)
                    ok = False
                up.add_metric([name], 1.0 if ok else 0.0)
        yield from counter_families(sources)
        yield up
        yield slots


def serve_metrics(ctl, address: str) -> MetricsServer:
    """Start the controller's /metrics endpoint on `address` (HOST:PORT, loopback default)."""
    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    registry.register(ControllerCollector(ctl))
    return MetricsServer(registry, address)
