"""Prometheus metrics shared by the switch exporters: the address rule, the HTTP endpoint, and
the metric families of the P4 counters (the same names whether the software switch exports
its own counters or the controller polls a BMv2/Tofino switch's over P4Runtime).

Names (docs/operations.md lists every metric of every process):

    spina_job_packets_received_total{job_id}       job_received: admitted contributions
    spina_job_packets_aggregated_total{job_id}     job_aggregated: contributions added to a slot
    spina_job_results_total{job_id}                job_results: result copies (rounds x workers)
    spina_job_drops_total{job_id,cause}            cause: duplicate | stale | held | congestion
    spina_job_congestion_seen_total{job_id}        job_congestion_seen: the loss budget's base
    spina_port_drops_total{port,cause}             cause: malformed | unadmitted

The job label is `job_id`, not `job`: Prometheus gives every target a `job` label of its own.

One owner per switch: a software switch exports its own P4 counters (read in memory at scrape
time, with or without a controller); the controller exports them only for switches that have
no endpoint of their own (BMv2, Tofino), so a sum over every scraped series counts each
contribution once. Every endpoint also serves, through MetricsServer:

    process_cpu_seconds_total, process_resident_memory_bytes, ...   prometheus_client's
                                                                    process collector (/proc)
    spina_build_info{version,python,proc}                           always 1
"""
from __future__ import annotations

import errno
import platform

from spina import owner
from spina.cli import parse_address

# P4 counter name -> (metric name, documentation, extra label). One family may gather several
# counters under a `cause` label (drops), as Prometheus naming asks.
JOB_FAMILIES = {
    "job_received": ("spina_job_packets_received", "Contributions admitted, per job.", None),
    "job_aggregated": ("spina_job_packets_aggregated",
                       "Contributions added into a slot (not duplicates or stale), per job.", None),
    "job_results": ("spina_job_results",
                    "Result packets sent, one per worker of each completed round, per job.", None),
    "job_duplicates": ("spina_job_drops", "Contributions not added, per job and cause.",
                       "duplicate"),
    "job_stale": ("spina_job_drops", None, "stale"),
    "job_held": ("spina_job_drops", None, "held"),
    "job_congestion_drops": ("spina_job_drops", None, "congestion"),
    "job_congestion_seen": ("spina_job_congestion_seen",
                            "Contributions the congestion drop saw (the loss budget's base), "
                            "per job.", None),
    # narrow lanes (spec.LANE_COUNTERS; v1model and the software switch, docs/bits.md)
    "job_lane_saturated": ("spina_job_lane_saturated",
                           "Narrow-lane results with a sum clipped to the lane's range, per job.",
                           None),
    "job_lane_mismatch": ("spina_job_lane_mismatch",
                          "Contributions whose lane width differed from their round's first "
                          "(the result is marked mismatch), per job.", None),
}
PORT_FAMILIES = {
    "port_malformed": ("spina_port_drops", "Packets dropped at ingress, per port and cause.",
                       "malformed"),
    "port_unadmitted": ("spina_port_drops", None, "unadmitted"),
}



class _Served:
    """What one endpoint serves: the component's registry, then the process's own series (a
    registry of our own, so the caller's registry is served unchanged anywhere else)."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from spina import log, version
        for family in self.registry.collect():
            # prometheus_client adds a `*_created` sample (a start time) to each counter and
            # histogram: series nobody asked for and docs/operations.md does not list
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
        info = GaugeMetricFamily("spina_build_info", "The running SpINA version; always 1.",
                                 labels=["version", "python", "proc"])
        info.add_metric([version(), platform.python_version(), log.proc_name()], 1.0)
        yield info


class MetricsServer:
    """The /metrics HTTP endpoint of one registry, on its own thread until `stop()`; beside
    the registry's own series it serves process_* (CPU, memory, file descriptors, start time)
    and spina_build_info.

    Args:
        registry: a prometheus_client CollectorRegistry (one per component instance).
        address: 'HOST:PORT' (see parse_address); port 0 picks a free one (see `.address`).
    """

    def __init__(self, registry, address: str):
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
        host, port = parse_address(address)
        served = CollectorRegistry()
        served.register(_Served(registry))
        ProcessCollector(registry=served)  # reads /proc at scrape time; nothing elsewhere
        try:
            self._httpd, self._thread = start_http_server(port, host, served)
        except OSError as e:  # name the address: "Address already in use" alone says nothing
            if e.errno == errno.EADDRINUSE:  # and who holds it (another SpINA process?)
                raise owner.AddressInUse("cannot serve metrics: " + owner.in_use(
                    "tcp", host, port, "metrics port")) from None
            raise OSError(e.errno, f"metrics address {host}:{port}: {e.strerror}") from None
        self.address = self._httpd.server_address[:2]

    @property
    def url(self) -> str:
        host = self.address[0]
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.address[1]}/metrics"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def counter_families(sources):
    """Metric families of P4 counter values. `sources` holds one (labels, {job: {counter:
    value}}, {port: {counter: value}}) triple per switch; `labels` (e.g. {"switch": "s1"},
    the same keys for every source) go on each of its samples."""
    from prometheus_client.core import CounterMetricFamily
    fams: dict[str, CounterMetricFamily] = {}

    def add(table, values: dict[str, int], key: str, keyval: int, extra: dict):
        for counter, value in values.items():
            if counter not in table:
                continue
            name, doc, cause = table[counter]
            fam = fams.get(name)
            if fam is None:
                doc = doc or next(d for n, d, _ in table.values() if n == name and d)
                fam = fams[name] = CounterMetricFamily(
                    name, doc, labels=[key] + (["cause"] if cause else []) + list(extra))
            fam.add_metric([str(keyval)] + ([cause] if cause else []) + list(extra.values()),
                           float(value))

    for labels, jobs, ports in sources:
        for job, values in sorted(jobs.items()):
            add(JOB_FAMILIES, values, "job_id", job, labels)
        for port, values in sorted(ports.items()):
            add(PORT_FAMILIES, values, "port", port, labels)
    return list(fams.values())
