"""The controller's Prometheus exporter: polls the P4 counters of every switch of the desired
state over P4Runtime when Prometheus scrapes (`--metrics [HOST:]PORT` with `serve` or
`deploy --watch`), so BMv2 and Tofino switches get the same metrics as the software switch.

Only for switches without an endpoint of their own (BMv2, Tofino): a software switch exports
its own counters (`spina switch --metrics`), and the same counter from two processes would be
counted twice by any sum (spina/metrics.py). Names: spina/metrics.py
(spina_job_*_total{job_id,switch}, spina_port_drops_total{port,cause,switch}), plus

    spina_controller_switch_up{switch}    1 if the switch answered the last poll and runs a
                                          pipeline (every switch, software ones too)
    spina_job_slots{job_id,switch}        the desired state's slot share of each job
"""
from __future__ import annotations

import logging

from controller.p4rt import P4RuntimeError
from spina.metrics import MetricsServer, counter_families

log = logging.getLogger("spina.controller")


def exports_own(sw) -> bool:
    """True for a switch whose own process serves its counters: the software switch."""
    return sw.target == "softswitch"


class ControllerCollector:
    """Reads the job and port counters of every switch `poll(sw)` picks (by default those not
    exporting their own) through a Controller at scrape time; every switch's up gauge."""

    def __init__(self, ctl, poll=lambda sw: not exports_own(sw)):
        self.ctl = ctl
        self.poll = poll

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
                polled = self.poll(sw)
                for j in jobs if polled else ():
                    slots.add_metric([str(j.id), name], j.nslots)
                try:
                    s = self.ctl.session(name)
                    ok = s.attach()
                    if ok and polled:
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


def serve_metrics(ctl, address: str, **collector) -> MetricsServer:
    """Start the controller's /metrics endpoint on `address` (HOST:PORT, loopback default);
    `collector`: ControllerCollector's options (poll)."""
    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    registry.register(ControllerCollector(ctl, **collector))
    return MetricsServer(registry, address)
