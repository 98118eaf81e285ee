"""Prometheus metrics: scrape the software switch's and the daemon's endpoints after known
traffic, and let a real Prometheus server (Debian's `prometheus`) scrape a running switch.

Run just this file: .venv/bin/python -m pytest tests/test_metrics.py
"""
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from host_agent.agent import Agent
from host_agent.local import LocalCluster
from softswitch.metrics import serve_metrics
from softswitch.udp import UdpSwitch
from spina import wire
from spina.config import JobConfig, WorkerAddr, job_to_dict
from spina.metrics import parse_address
from spina.net import bound_udp_socket, free_port
from spina.procs import stop_process
from tests.waits import until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}


def scrape(url: str) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of one scrape."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_address_defaults_to_loopback_and_refuses_wildcards():
    """A bare port binds 127.0.0.1; 0.0.0.0, :: and an empty host are refused with a reason."""
    assert parse_address("9100") == ("127.0.0.1", 9100)
    assert parse_address("10.1.2.3:9100") == ("10.1.2.3", 9100)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("0.0.0.0:9100", "[::]:9100", "x:y", "host.example:9100"):
        with pytest.raises(ValueError, match="metrics address"):
            parse_address(bad)
    with pytest.raises(ValueError, match="wildcard"):
        parse_address("0.0.0.0:9100")


def test_switch_cli_refuses_a_wildcard_metrics_address():
    """`python -m softswitch udp --metrics 0.0.0.0:9100` exits 2 with a one-line error."""
    r = subprocess.run([sys.executable, "-m", "softswitch", "udp", "--port", "0",
                        "--metrics", "0.0.0.0:9100"], capture_output=True, text=True,
                       timeout=60, env=ENV, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "wildcard" in r.stderr


def test_switch_scrape_counts_known_traffic():
    """After two all-reduces of 2 workers and one malformed and one unadmitted datagram, the
    switch's endpoint reports exactly the packets the agents sent, the results, the drops
    by cause and the slots the job holds."""
    sw = UdpSwitch(port=0).start()
    server = serve_metrics(sw.pipeline, sw, "127.0.0.1:0")
    try:
        # a long RTO: a resend under load (a duplicate at the switch) would make the counts
        # inexact; the test counts known traffic, not recovery
        with LocalCluster(2, job=5, switch=sw, rto=5.0, nslots=4, block_size=8, nlanes=2) as c:
            x = np.zeros(1024, np.float32)
            x[::100] = 1.0  # sparse: some blocks are zero
            sent = results = 0
            for _ in range(2):
                c.allreduce([x, 2 * x])
                sent += sum(a.last_stats.packets_sent for a in c.agents)
                results += sum(a.last_stats.packets_received for a in c.agents)
                assert sum(a.last_stats.resends for a in c.agents) == 0
            stray = bound_udp_socket()
            stray.sendto(b"not an INA packet", sw.address)
            stray.sendto(wire.pack(wire.Header(job=5, rank=0, nlanes=1, block_size=8),
                                   [wire.END]), sw.address)
            until(lambda: sw.packets_in >= sent + 2, "the switch to take the 2 strays", 10)
            stray.close()
            m = scrape(server.url)
            assert m[("spina_job_packets_received_total", (("job_id", "5"),))] == sent
            assert m[("spina_job_packets_aggregated_total", (("job_id", "5"),))] == sent
            # one result per worker per round (the multicast copies), and none was lost
            assert m[("spina_job_results_total", (("job_id", "5"),))] == results
            assert m[("spina_job_drops_total", (("cause", "duplicate"), ("job_id", "5")))] == 0
            assert m[("spina_port_drops_total", (("cause", "malformed"), ("port", "0")))] == 1
            assert m[("spina_port_drops_total", (("cause", "unadmitted"), ("port", "0")))] == 1
            assert m[("spina_switch_packets_received_total", ())] == sent + 2
            assert m[("spina_switch_packets_sent_total", ())] == results
            assert m[("spina_switch_send_errors_total", ())] == sw.send_errors == 0
            assert m[("spina_switch_bytes_received_total", ())] == sw.bytes_in
            assert m[("spina_switch_slots_in_use", ())] == 4
            assert m[("spina_job_slots", (("job_id", "5"),))] == 4
            assert m[("spina_job_workers", (("job_id", "5"),))] == 2
            assert m[("spina_switch_pool_slots", ())] == sw.pipeline.pool_slots
    finally:
        server.stop()
        sw.stop()


def _start(cmd, want: str, timeout: float = 60.0):
    """Start `cmd`; return (process, the first stdout line starting with `want`)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, cwd=ROOT)
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(want):
            return proc, line.strip()
    stop_process(proc)
    raise AssertionError(f"{cmd[:4]}: no {want!r} line; stderr: {proc.stderr.read()[-2000:]}")


def prometheus_query(tmp_path, config: dict, want: dict[str, dict]) -> dict[str, dict]:
    """Run a Prometheus server on loopback with `config` (prometheus.yml's content) until
    each query of `want` answers its value ({tuple of the result's label values: value}) or
    90 s pass; the last answers. Skips, saying why, without Debian's prometheus."""
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.skip("prometheus is not on PATH (Debian: apt-get install prometheus; "
                    "scripts/setup.sh installs it as root)")
    web = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(json.dumps(config))  # JSON is YAML
    server = subprocess.Popen([prom, f"--config.file={cfg}", f"--web.listen-address={web}",
                               f"--storage.tsdb.path={tmp_path / 'data'}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got: dict[str, dict] = {}
    deadline = time.time() + 90
    try:
        while time.time() < deadline and got != want:
            for query in want:
                try:
                    ans = json.load(urllib.request.urlopen(
                        f"http://{web}/api/v1/query?query={urllib.parse.quote(query)}",
                        timeout=5))
                except OSError:
                    break  # not listening yet
                got[query] = {tuple(r["metric"].values()): float(r["value"][1])
                              for r in ans["data"]["result"]}
            time.sleep(0.5)
    finally:
        assert stop_process(server, 20) == 0, server.stderr.read()[-2000:]
    return got


def test_real_prometheus_scrapes_a_running_switch(tmp_path):
    """A Prometheus server started on loopback scrapes `python -m softswitch udp --metrics`
    and answers a PromQL query with the number of contributions the workers sent."""
    if shutil.which("prometheus") is None:
        prometheus_query(tmp_path, {}, {})  # skips, saying why, before any process
    socks = [bound_udp_socket() for _ in range(2)]
    job = JobConfig(job=3, workers=tuple(WorkerAddr(r, *s.getsockname())
                                         for r, s in enumerate(socks)), block_size=16, nlanes=4)
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([job_to_dict(job)]))
    sw, line = _start([sys.executable, "-m", "softswitch", "udp", "--port", "0", "--jobs",
                       str(jobs), "--metrics", "127.0.0.1:0"], "listening")
    try:
        host, port = line.split()[1].rsplit(":", 1)
        metrics_url = sw.stdout.readline().split()[1]
        target = urllib.parse.urlparse(metrics_url).netloc
        agents = [Agent(job, r, (host, int(port)), sock=s, timeout=20) for r, s in enumerate(socks)]
        x = np.arange(4096, dtype=np.float32)
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda a: a.allreduce(x), agents))
        sent = sum(a.last_stats.packets_sent for a in agents)
        for a in agents:
            a.close()
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "spina", "static_configs": [{"targets": [target]}]}]}
        query = 'sum(spina_job_packets_received_total{job_id="3"})'
        got = prometheus_query(tmp_path, config, {query: {(): sent}})
        assert got == {query: {(): sent}}, f"Prometheus answered {got}, the workers sent {sent}"
    finally:
        stop_process(sw)


@contextlib.contextmanager
def _lossy_daemon(tmp_path, seed: int):
    """(job, daemon, [client of rank 0, 1]): a 2-rank job on a switch that drops 10% of what
    arrives, an in-process daemon serving its metrics, a client per rank (closed by the test)."""
    import threading

    from host_agent.daemon import DaemonClient
    from host_agent.daemon.server import Daemon, DaemonConfig
    from host_agent.launch import local_job
    from softswitch.udp import Faults
    from spina.config import JobFile
    job = local_job(2)
    with UdpSwitch(port=0, faults=Faults(drop_in=0.1, seed=seed)) as sw:
        sw.add_job(job)
        JobFile(job, sw.address).write(tmp_path / "job.json")
        d = Daemon(DaemonConfig(socket=str(tmp_path / "a.sock"), timeout=20, rto=0.02,
                                metrics="127.0.0.1:0"))
        t = threading.Thread(target=d.serve_forever, daemon=True)
        t.start()
        try:
            yield job, d, [DaemonClient(str(tmp_path / "job.json"), r, str(tmp_path / "a.sock"))
                           for r in range(2)]
        finally:
            d.stop()
            t.join(10)


def test_daemon_scrape_counts_calls_packets_and_resends(tmp_path):
    """Two ranks each make three calls through an in-process daemon while the switch loses
    10% of arriving packets: the daemon's endpoint reports the calls, the latency histogram's
    count and exactly the packets, bytes and resends the calls' stats add up to."""
    with _lossy_daemon(tmp_path, seed=4) as (job, d, clients):
        stats = {0: [], 1: []}
        x = np.linspace(-1, 1, 20000, dtype=np.float32)

        def run(c):
            for _ in range(3):
                c.allreduce(x)
                stats[c.rank].append(c.last_stats)
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(run, clients))
        for c in clients:
            c.close()
        m = scrape(d.metrics_server.url)
        assert [k for k in m if k[0].endswith("_created")] == []  # undocumented series
        jid = str(job.job)
        assert sum(s.resends for r in stats for s in stats[r]) > 0, "the loss caused resends"
        for r in (0, 1):
            lab = (("job_id", jid), ("rank", str(r)))
            assert m[("spina_agent_calls_total", lab[:1] + (("outcome", "ok"), lab[1]))] == 3
            for field, metric in (("packets_sent", "packets_sent"), ("resends", "resends"),
                                  ("bytes_received", "bytes_received"),
                                  ("malformed_packets", "malformed_packets"),
                                  ("length", "elements")):
                want = sum(getattr(s, field) for s in stats[r])
                assert m[(f"spina_agent_{metric}_total", lab)] == want, metric
        assert m[("spina_agent_call_duration_seconds_count", (("job_id", jid),))] == 6
        assert m[("spina_agent_agents", ())] == 2
        assert m[("spina_agent_calls_in_progress", ())] == 0


def test_daemon_counts_the_all_gather_like_the_all_reduce(tmp_path):
    """Three all-gathers of 2 ranks through a daemon under 10% loss at the switch: the
    spina_agent_gather_* series are the sums of the calls' GatherStats (chunks re-requested
    and resent too: the loss made some), three ok calls per rank, six latencies."""
    with _lossy_daemon(tmp_path, seed=5) as (job, d, clients):
        stats = {0: [], 1: []}
        x = np.arange(300_000, dtype=np.float32)  # 1.2 MB: tens of chunks a call

        def run(c):
            for _ in range(3):
                np.testing.assert_array_equal(c.allgather(x), np.stack([x, x]))
                stats[c.rank].append(c.last_gather_stats)
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(run, clients))
        for c in clients:
            c.close()
        m = scrape(d.metrics_server.url)
        jid = str(job.job)
        assert sum(s.requests for r in stats for s in stats[r]) > 0, "the loss cost chunks"
        for r in (0, 1):
            lab = (("job_id", jid), ("rank", str(r)))
            assert m[("spina_agent_gather_calls_total",
                      lab[:1] + (("outcome", "ok"), lab[1]))] == 3
            for field in ("packets_sent", "packets_received", "bytes_sent", "requests",
                          "resends", "duplicates", "shard_bytes"):
                want = sum(getattr(s, field) for s in stats[r])
                assert m[(f"spina_agent_gather_{field}_total", lab)] == want, field
            assert m[("spina_agent_gather_shard_bytes_total", lab)] == 3 * x.nbytes
        assert m[("spina_agent_gather_call_duration_seconds_count", (("job_id", jid),))] == 6
        assert ("spina_agent_calls_total", (("job_id", jid), ("outcome", "ok"),
                                            ("rank", "0"))) not in m  # no all-reduce


def test_an_in_process_agent_serves_its_metrics(tmp_path, monkeypatch):
    """$SPINA_METRICS makes every agent assignment.connect builds serve its metrics at the
    port plus $LOCAL_RANK: two calls of rank 1 counted (ok, packets as its stats say, latency
    count), process_* and build_info served; the endpoint stops with the agent; a bad value
    is refused naming the variable."""
    import concurrent.futures

    from host_agent import assignment
    from host_agent.launch import local_job
    from host_agent.metrics import env_address
    from spina.config import Assignment, ConfigError, write_if_changed
    job = local_job(2)
    base = free_port()
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        for r in range(2):
            write_if_changed(tmp_path / f"rank{r}.json",
                             Assignment(job, r, sw.address).to_dict())
        monkeypatch.setenv("SPINA_METRICS", f"127.0.0.1:{base - 1}")
        monkeypatch.setenv("LOCAL_RANK", "1")
        a1 = assignment.connect(tmp_path / "rank1.json", timeout=20)
        monkeypatch.delenv("SPINA_METRICS")
        a0 = assignment.connect(tmp_path / "rank0.json", timeout=20)
        assert a0.metrics is None and a1.metrics is not None
        x = np.arange(5000, dtype=np.int32)
        sent = 0
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(2):
                list(pool.map(lambda a: a.allreduce(x), (a0, a1)))
                sent += a1.last_stats.packets_sent
            list(pool.map(lambda a: a.allgather(x), (a0, a1)))  # counted as an all-gather
        gathered = a1.last_gather_stats
        url = f"http://127.0.0.1:{base}/metrics"
        m = scrape(url)
        lab = (("job_id", str(job.job)), ("rank", "1"))
        assert m[("spina_agent_calls_total", lab[:1] + (("outcome", "ok"), lab[1]))] == 2
        assert m[("spina_agent_packets_sent_total", lab)] == sent
        assert m[("spina_agent_elements_total", lab)] == 2 * len(x)
        assert m[("spina_agent_call_duration_seconds_count", lab[:1])] == 2
        assert m[("spina_agent_gather_calls_total", lab[:1] + (("outcome", "ok"), lab[1]))] == 1
        assert m[("spina_agent_gather_shard_bytes_total", lab)] == x.nbytes
        assert m[("spina_agent_gather_packets_sent_total", lab)] == gathered.packets_sent > 0
        assert m[("spina_agent_gather_call_duration_seconds_count", lab[:1])] == 1
        assert any(name == "process_cpu_seconds_total" for name, _ in m)
        assert any(name == "spina_build_info" for name, _ in m)
        a0.close()
        a1.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)  # stopped with its agent
    for bad in ("0.0.0.0:9100", "nine", "127.0.0.1:65535"):
        monkeypatch.setenv("SPINA_METRICS", bad)
        with pytest.raises(ConfigError, match=r"^\$SPINA_METRICS: "):
            env_address()


@contextlib.contextmanager
def _deployed_job(tmp_path, switch_metrics: bool = False, **collector):
    """A software switch with a P4Runtime server (and its own endpoint if `switch_metrics`),
    a controller deployed as `serve` does with its endpoint (ControllerCollector options
    `collector`), and one all-reduce of job 4 by 2 ranks done. Yields (switch, controller
    endpoint, switch endpoint or None, packets the ranks sent); stops all of them."""
    import yaml

    from controller.controller import Controller
    from controller.metrics import serve_metrics as serve_controller_metrics
    from controller.state import load
    from host_agent import assignment
    from softswitch.p4runtime_server import P4RuntimeServer
    sw = UdpSwitch("127.0.0.1", 0).start()
    srv = P4RuntimeServer(sw.dataplane, "127.0.0.1:0", servicer=sw.servicer()).start()
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump({
        "switches": [{"name": "s1", "target": "softswitch", "grpc": srv.address,
                      "address": "127.0.0.1", "udp_port": sw.address[1]}],
        "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "switch_port": 0,
                     "udp_port": bound_udp_socket().getsockname()[1]} for i in range(2)],
        "jobs": [{"id": 4, "members": ["w0", "w1"], "nslots": 4, "slot_base": 0,
                  "block_size": 32, "nlanes": 4}],
        "agents_dir": "agents", "rendezvous": f"127.0.0.1:{free_port()}"}))
    swm = serve_metrics(sw.pipeline, sw, "127.0.0.1:0") if switch_metrics else None
    try:
        with Controller(load(cfg), 1, timeout=20) as ctl, ctl.runs():  # as `serve`
            ctl.deploy()
            server = serve_controller_metrics(ctl, "127.0.0.1:0", **collector)
            try:
                agents = [assignment.connect(tmp_path / "agents" / f"job4-rank{r}.json",
                                             timeout=20) for r in range(2)]
                import concurrent.futures
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    list(pool.map(lambda a: a.allreduce(np.arange(3000, dtype=np.int32)), agents))
                sent = sum(a.last_stats.packets_sent for a in agents)
                for a in agents:
                    a.close()
                yield sw, server, swm, sent
            finally:
                server.stop()
    finally:
        if swm is not None:
            swm.stop()
        srv.stop()
        sw.stop()


def test_controller_exports_p4_counters_polled_over_p4runtime(tmp_path):
    """Told to poll a software switch too, the controller's endpoint reports the P4 counters
    it reads over P4Runtime after a deployed job's all-reduce: the values the switch holds."""
    with _deployed_job(tmp_path, poll=lambda sw: True) as (sw, server, _, sent):
        m = scrape(server.url)
        lab = (("job_id", "4"), ("switch", "s1"))
        assert m[("spina_job_packets_received_total", lab)] == sent
        assert m[("spina_job_results_total", lab)] == sw.pipeline.job_counters(4)["job_results"] > 0
        assert m[("spina_port_drops_total", (("cause", "malformed"), ("port", "0"),
                                             ("switch", "s1")))] == 0
        assert m[("spina_controller_switch_up", (("switch", "s1"),))] == 1
        assert m[("spina_job_slots", lab)] == 4


def documented_scrape_config() -> dict:
    """The scrape config docs/operations.md gives, parsed."""
    import re

    import yaml
    docs = open(os.path.join(ROOT, "docs", "operations.md")).read()
    block = re.search(r"```yaml\n(scrape_configs:.*?)```", docs, re.S).group(1)
    return yaml.safe_load(block)


def scrape_as_prometheus(config: dict, urls: dict[str, str]) -> list[tuple[str, dict, float]]:
    """Every sample of every target of `config` as Prometheus stores it: (name, labels, value)
    with the target's `job`, `instance` and static labels added (a scraped label of the same
    name becomes exported_NAME, as with honor_labels: false). `urls` maps a documented target
    to the endpoint standing in for it; targets not in it are not running."""
    out = []
    for job in config["scrape_configs"]:
        for group in job["static_configs"]:
            for target in group["targets"]:
                if target not in urls:
                    continue
                text = urllib.request.urlopen(urls[target], timeout=10).read().decode()
                add = {"job": job["job_name"], "instance": target, **group.get("labels", {})}
                for fam in text_string_to_metric_families(text):
                    for smp in fam.samples:
                        labels = {("exported_" + k if k in add else k): v
                                  for k, v in smp.labels.items()}
                        out.append((smp.name, {**labels, **add}, smp.value))
    return out


def test_documented_scrape_of_switch_and_controller_counts_each_packet_once(tmp_path):
    """Switch and controller scraped as docs/operations.md's config says: sum by (switch) of
    spina_job_packets_received_total{job_id="4"} over every series is {s1: the switch's own
    count}, each endpoint has spina_build_info and process_max_fds exactly."""
    import resource

    from spina import version
    cfg = documented_scrape_config()
    targets = [t for g in cfg["scrape_configs"][0]["static_configs"] for t in g["targets"]]
    assert targets == ["127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102"]
    with _deployed_job(tmp_path, switch_metrics=True) as (sw, server, swm, sent):
        series = scrape_as_prometheus(cfg, {"127.0.0.1:9100": swm.url,
                                            "127.0.0.1:9102": server.url})
        own = sw.pipeline.job_counters(4)
    sums: dict[str, float] = {}
    for name, labels, value in series:
        if name == "spina_job_packets_received_total" and labels["job_id"] == "4":
            sums[labels.get("switch")] = sums.get(labels.get("switch"), 0) + value
    assert own["job_received"] == sent > 0
    assert sums == {"s1": sent}
    up = [(lab, v) for n, lab, v in series if n == "spina_controller_switch_up"]
    assert up == [({"switch": "s1", "job": "spina", "instance": "127.0.0.1:9102"}, 1.0)]
    for target in ("127.0.0.1:9100", "127.0.0.1:9102"):
        mine = {n: (lab, v) for n, lab, v in series if lab["instance"] == target}
        lab, v = mine["spina_build_info"]
        assert (lab["version"], lab["python"], v) == (version(), platform.python_version(), 1)
        assert mine["process_max_fds"][1] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_documented_sample_is_what_a_switch_serves():
    """docs/operations.md's sample scrape lists exactly the series a software switch serves
    after one call of 1M floats (one non-zero in 1000) by 4 workers, with those values (issue
    44 item 7: it lacked held, congestion_seen, lane_* and send_errors)."""
    import re
    docs = open(os.path.join(ROOT, "docs", "operations.md")).read()
    block = re.search(r"```text\n(spina_job_packets_received_total.*?)```", docs, re.S).group(1)
    documented = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for fam in text_string_to_metric_families(block) for s in fam.samples
                  if s.name != "spina_build_info"}
    with LocalCluster(4, block_size=256, nlanes=56, nslots=16) as c:
        m = serve_metrics(c.switch.pipeline, c.switch, "127.0.0.1:0")
        try:
            x = np.zeros(1_000_000, np.float32)
            x[::1000] = 1.0
            c.allreduce([x.copy() for _ in range(4)])
            resends = sum(a.last_stats.resends for a in c.agents)
            got = {k: v for k, v in scrape(m.url).items()
                   if k[0].startswith("spina_") and k[0] != "spina_build_info"}
        finally:
            m.stop()
    assert sorted(got) == sorted(documented)
    if resends == 0:  # (a loaded machine's late round is resent: more packets, same series)
        assert got == documented


def test_agent_launch_serves_its_switch_metrics(tmp_path):
    """`spina agent launch --metrics 127.0.0.1:0` prints its endpoint, which serves the
    launched switch's job (docs/operations.md says so)."""
    job_file = tmp_path / "job.json"
    p = subprocess.Popen([sys.executable, "-m", "spina_cli", "agent", "launch", "--nworkers", "2",
                          "--job-file", str(job_file), "--metrics", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert line.startswith("metrics http://127.0.0.1:"), line
        m = scrape(line.split()[1])
        assert m[("spina_job_workers", (("job_id", "1"),))] == 2
        assert m[("spina_job_packets_received_total", (("job_id", "1"),))] == 0
    finally:
        p.terminate()
        assert p.wait(timeout=30) == 0
        p.stdout.close()


def test_controller_metrics_only_with_long_running_commands(tmp_path):
    """`controller --metrics` with a one-shot command, or a wildcard address, exits 2 with a
    one-line error naming --metrics."""
    cfg = tmp_path / "spina.yaml"
    cfg.write_text("switches: []\nworkers: []\njobs: []\n")
    for args, why in ((["--metrics", "9100", "status"], "serve"),
                      (["--metrics", "0.0.0.0:9100", "deploy", "--watch", "1"], "wildcard")):
        r = subprocess.run([sys.executable, "-m", "controller", "-c", str(cfg), *args],
                           capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and why in r.stderr and "metrics" in r.stderr


def test_dashboard_and_docs_name_only_exported_metrics():
    """Every metric the Grafana dashboard queries is in docs/operations.md's table, and every
    family the exporters define is documented there."""
    import re

    from host_agent.metrics import AgentMetrics
    from spina.metrics import JOB_FAMILIES, PORT_FAMILIES
    docs = open(os.path.join(ROOT, "docs", "operations.md")).read()
    dash = json.load(open(os.path.join(ROOT, "docs", "grafana-spina.json")))
    used = {n for p in dash["panels"] for t in p["targets"]
            for n in re.findall(r"spina_\w+", t["expr"])}
    exported = {n + "_total" for n, _, _ in (*JOB_FAMILIES.values(), *PORT_FAMILIES.values())}
    exported |= {f.name + ("_total" if f.type == "counter" else "")
                 for f in AgentMetrics().registry.collect()}
    for name in used | exported:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert base in docs or base.replace("_total", "") in docs or \
            re.sub(r"_(received|sent)_total$", "", base) in docs, name


PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = ("promtool is not on PATH (Debian's prometheus package has it: scripts/setup.sh "
               "installs it as root)")
ALERT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # job 1: results stop after minute 3 while contributions keep arriving; job 2 healthy
      - series: 'spina_job_packets_received_total{{job_id="1", switch="s1"}}'
        values: '0+60x12'
      - series: 'spina_job_results_total{{job_id="1", switch="s1"}}'
        values: '0+60x3 180x9'
      - series: 'spina_job_packets_received_total{{job_id="2", switch="s1"}}'
        values: '0+60x12'
      - series: 'spina_job_results_total{{job_id="2", switch="s1"}}'
        values: '0+60x12'
      # job 1 resends 2 of 100 packets, job 2 none
      - series: 'spina_agent_resends_total{{job_id="1", rank="0"}}'
        values: '0+120x12'
      - series: 'spina_agent_packets_sent_total{{job_id="1", rank="0"}}'
        values: '0+6000x12'
      - series: 'spina_agent_resends_total{{job_id="2", rank="0"}}'
        values: '0x12'
      - series: 'spina_agent_packets_sent_total{{job_id="2", rank="0"}}'
        values: '0+6000x12'
      # s2's endpoint stops answering at minute 5; the controller reads s3 until minute 8
      - series: 'up{{job="spina", instance="127.0.0.1:9100", switch="s2"}}'
        values: '1x4 0x8'
      - series: 'up{{job="spina", instance="127.0.0.1:9101"}}'
        values: '0x12'
      - series: 'spina_controller_switch_up{{job="spina", instance="127.0.0.1:9102", switch="s3"}}'
        values: '1x7 0x5'
    alert_rule_test: {cases}
"""


def _alert_cases(alert: str, quiet_at: str, fires_at: str, *fired: tuple[dict, str]) -> list[dict]:
    """promtool's two cases for one alert: none at `quiet_at`, exactly `fired` (each its labels
    and summary) at `fires_at`."""
    return [{"eval_time": quiet_at, "alertname": alert, "exp_alerts": []},
            {"eval_time": fires_at, "alertname": alert,
             "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": summary}}
                            for labels, summary in fired]}]


# what ALERT_TESTS' series must fire, as JSON (a YAML flow sequence) in its alert_rule_test
ALERT_CASES = [
    *_alert_cases("SpinaJobRoundsStalled", "4m", "8m",
                  ({"severity": "critical", "job_id": "1"},
                   "job 1: contributions arrive, no round completes")),
    *_alert_cases("SpinaResendsRising", "4m", "10m",
                  ({"severity": "warning", "job_id": "1"},
                   "job 1: 2 resends/s, over 1% of packets")),
    *_alert_cases("SpinaSwitchDown", "5m", "9m",
                  *(({"severity": "critical", "job": "spina", "instance": f"127.0.0.1:{port}",
                      "switch": sw}, f"switch {sw} does not answer (127.0.0.1:{port})")
                    for sw, port in (("s2", 9100), ("s3", 9102)))),
]


def test_real_prometheus_with_the_documented_config_sums_each_packet_once(tmp_path):
    """A Prometheus server scraping switch and controller with docs/operations.md's config
    (targets moved to the endpoints' ports) answers sum by (switch) of the job's admitted
    contributions with {s1: the switch's own count}, and both targets are up."""
    if shutil.which("prometheus") is None:
        prometheus_query(tmp_path, {}, {})  # skips, saying why, before any process
    cfg = documented_scrape_config()
    with _deployed_job(tmp_path, switch_metrics=True) as (sw, server, swm, sent):
        moved = {"127.0.0.1:9100": "%s:%d" % swm.address[:2],
                 "127.0.0.1:9102": "%s:%d" % server.address[:2]}
        for group in cfg["scrape_configs"][0]["static_configs"]:
            group["targets"] = [moved[t] for t in group["targets"] if t in moved]
        cfg["global"] = {"scrape_interval": "1s"}
        assert cfg["scrape_configs"][0].pop("scrape_interval") == "15s"  # the doc's; 1s here
        own = sw.pipeline.job_counters(4)["job_received"]
        assert own == sent > 0
        want = {'sum by (switch) (spina_job_packets_received_total{job_id="4"})': {("s1",): own},
                "sum(up)": {(): 2.0}}
        got = prometheus_query(tmp_path, cfg, want)
        assert got == want, f"Prometheus answered {got}, the switch counted {own}"


def test_alert_rules_pass_promtool_and_fire_on_the_series_they_describe(tmp_path):
    """docs/spina-alerts.yml passes `promtool check rules` (3 rules), and `promtool test
    rules` fires each alert for exactly the job or switch whose series go wrong."""
    if PROMTOOL is None:
        pytest.skip(NO_PROMTOOL)
    rules = os.path.join(ROOT, "docs", "spina-alerts.yml")
    r = subprocess.run([PROMTOOL, "check", "rules", rules], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "SUCCESS: 3 rules found" in r.stdout, r.stdout + r.stderr
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(ALERT_TESTS.format(rules=rules, cases=json.dumps(ALERT_CASES)))
    r = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_dashboard_queries_parse_and_filter_on_its_variables(tmp_path):
    """Every query of docs/grafana-spina.json parses as PromQL (promtool, as recording rules),
    every series it selects filters on $instance, those with a job_id on $job_id, and both
    variables are defined."""
    import re
    dash = json.load(open(os.path.join(ROOT, "docs", "grafana-spina.json")))
    assert [v["name"] for v in dash["templating"]["list"]] == ["instance", "job_id"]
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for e in exprs:
        for name, sel in re.findall(r"\b((?:spina|process)_\w+)(\{[^}]*\})?", e):
            if name == "spina_build_info":  # the join's right side: one series per process
                continue
            assert 'instance=~"$instance"' in sel, (name, e)
            if name.startswith(("spina_job_", "spina_agent_")):
                assert 'job_id=~"$job_id"' in sel, (name, e)
    if PROMTOOL is None:
        pytest.skip(NO_PROMTOOL + "; the filters were checked, the PromQL was not parsed")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": e.replace("$instance", ".*")
         .replace("$job_id", ".*")} for i, e in enumerate(exprs)]}]}
    f = tmp_path / "dashboard_rules.yml"
    f.write_text(json.dumps(rules))  # JSON is YAML
    r = subprocess.run([PROMTOOL, "check", "rules", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in r.stdout, \
        r.stdout + r.stderr
