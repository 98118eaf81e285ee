"""hier: hierarchical reduction through the daemon vs one rank per process, on loopback or
over rate-limited links between network namespaces.

    python -m bench hier                                   # 16 processes, 4 per host, 4 MiB
    python -m bench hier -t bench/topologies/star4.yaml -g 16 --local 4      # as root
    ... -m hier                                            # one mode alone

-g training processes in -g/--local "hosts", each host a daemon process (`python -m
host_agent daemon`, its own socket) with --local training processes (DaemonClients, one
process each); one software switch (a process of its own, bench.procs.switch_main, one per
mode). Methods: `flat`: every process is its own rank of a g-rank job (today's mode); `hier`:
the L processes of a host are local ranks of one rank of an H-rank job
(host_agent/daemon/hier.py). Both sum the same dense float32 tensors of the size.

On loopback every process is in this namespace. With -t (a star file: one aggregating
switch, a link per host; its hosts are the hosts) each host is a namespace of the file built
by spina/netgraph.py's Graph, its one veth to the switch namespace limited by tbf to the
file's rate (or --rates) in both directions; the host's daemon and its L training processes
run in its namespace (the daemon's unix socket is on the shared filesystem), the job's worker
addresses are the hosts' namespace addresses, and the switch runs in the switch namespace.
Everything is removed on exit, also on errors.

The modes run one after the other (not paired: each needs its own processes); time is the
median call of every process after its first (-n calls after one). Columns besides the
harness's: the switch's datagrams and bytes in+out per call (exact counts), each host's
agents' bytes on its link per call (exact UDP payload; `bytes_per_link` their mean), the
resends, and with -t each host's veth tx+rx bytes per call (headers and IP fragments
included) and the tbf and kernel UDP drops. Every sum is checked in every training process
against numpy's float64 sum, within 1e-5 of it relatively (`wrong`). docs/collectives.md shows
runs.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import method_rows
from bench.net_topo import dev_bytes, kernel_losses_total, star_of
from bench.paired import stop_all
from bench.procs import switch_main
from host_agent.launch import local_job
from spina import netns
from spina.config import JobConfig, JobFile, WorkerAddr
from spina.netgraph import Graph

ROOT = Path(__file__).resolve().parents[1]


def data(seed: int, n: int) -> np.ndarray:
    """Training process `seed`'s tensor (values in 0.5..1.5)."""
    return (np.random.default_rng(seed).random(n) + 0.5).astype(np.float32)


def worker(job_file: str, rank: int, sock: str, local_rank: int, local_size: int, n: int,
           calls: int, seed: int, nprocs: int) -> None:
    """One training process: `calls` all-reduces, each result checked against numpy's sum of
    every process's tensor; prints its times, last stats and wrong calls as JSON."""
    from host_agent.daemon import DaemonClient
    x = data(seed, n)
    want = np.sum([data(s, n).astype(np.float64) for s in range(nprocs)], axis=0)
    kw = dict(local_rank=local_rank, local_size=local_size) if local_size else {}
    times, nbytes, resends, wrong = [], [], 0, 0
    with DaemonClient(job_file, rank, sock, **kw) as c:
        for _ in range(calls):
            t0 = time.perf_counter()
            got = c.allreduce(x)
            times.append(time.perf_counter() - t0)
            # float32 sums of nprocs values in 0.5..1.5, quantized on the way (2^-31 of the
            # largest: docs/aggregation.md): far within 1e-5 of the float64 sum, relatively
            wrong += int((np.abs(np.asarray(got, np.float64) - want) > 1e-5 * want).any())
            nbytes.append(c.last_stats.bytes_sent + c.last_stats.bytes_received)
            resends += c.last_stats.resends
    print(json.dumps({"times": times, "bytes": nbytes, "resends": resends, "wrong": wrong}),
          flush=True)


WORKER_PORT = 50000  # the namespaces are new: rank r's agent binds WORKER_PORT + r


class Hosts:
    """Where the H hosts and the switch live: this namespace (`graph` None, loopback) or a
    namespace each of the star `graph` (its hosts' addresses, the switch at the aggregating
    switch's)."""

    def __init__(self, H: int, graph: Graph | None = None):
        self.H, self.star = H, graph
        if graph is None:
            self.ns, self.switch_ns, self.switch_ip, self.ips = [None] * H, None, "127.0.0.1", []
            return
        sw, hosts = star_of(graph.topo)
        self.ns = [graph.ns(h) for h in hosts]
        self.switch_ns, self.switch_ip = graph.ns(sw), graph.node_ip(sw)
        self.ips = [graph.host_ip(h) for h in hosts]

    def job(self, ranks: int, job: int, nslots: int) -> JobConfig:
        """The job of `ranks` ranks (H: a rank per host; H*L: L consecutive ranks a host),
        `nslots` slots (every agent's window)."""
        if self.star is None:
            return local_job(ranks, job=job, nslots=nslots)
        per = ranks // self.H
        return JobConfig(job=job, nslots=nslots, workers=tuple(
            WorkerAddr(r, self.ips[r // per], WORKER_PORT + r)
            for r in range(ranks))).validate()

    def link_bytes(self, pids: list[int]) -> list[int]:
        """tx + rx bytes of every host's veth so far (pids[h]: a process in host h's ns)."""
        return [sum(dev_bytes(pid=p)) for p in pids]

    def drops(self, pids: list[int]) -> tuple[int, int]:
        """(packets every link's tbf dropped, UDP datagrams the kernels of `pids`' namespaces
        dropped on receive or failed to reassemble) so far."""
        return self.star.tbf_drops(), kernel_losses_total(pids)["udp_drops"]


class _Switch:
    """The software switch process of one mode (bench.procs.switch_main) at `hosts`' switch
    place; stop() returns its counters, close() ends it whatever happened."""

    def __init__(self, hosts: Hosts):
        ctx = mp.get_context("spawn")
        self.stopped = False
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=switch_main, name="spina-switch",
                                args=(child, None, hosts.switch_ns, hosts.switch_ip))
        self.proc.start()
        self.address = self._recv("its address")

    def _recv(self, what: str):
        if not self.conn.poll(60):
            raise RuntimeError(f"switch: no {what} within 60 s")
        return self.conn.recv()

    def admit(self, job: JobConfig) -> None:
        self.conn.send(job)
        self._recv("admission")

    def stop(self) -> dict:
        self.stopped = True
        self.conn.send("stop")
        return self._recv("counters")

    def close(self) -> None:
        if not self.stopped and self.proc.is_alive():
            try:
                self.conn.send("stop")
            except OSError:
                pass
        stop_all([self.proc])


def run_mode(hosts: Hosts, tmp: Path, mode: str, L: int, n: int, calls: int, job: int,
             rto: float, timeout: float, nslots: int) -> dict:
    H = hosts.H
    jobcfg = hosts.job(H if mode == "hier" else H * L, job, nslots)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")]))
    socks = [str(tmp / f"{mode}{h}.sock") for h in range(H)]
    daemons, procs = [], []
    sw = _Switch(hosts)
    try:
        sw.admit(jobcfg)
        job_file = tmp / f"{mode}.json"
        JobFile(jobcfg, sw.address).write(job_file)
        for h, s in enumerate(socks):
            cfg = tmp / f"{mode}{h}.json"  # rto: fewer timer resends on a loaded 2-core machine
            cfg.write_text(json.dumps({"socket": s, "log_level": "WARNING", "rto": rto}))
            daemons.append(subprocess.Popen(netns.command(
                hosts.ns[h], sys.executable, "-m", "host_agent", "daemon", "--config", cfg),
                env=env, cwd=ROOT))
        deadline = time.monotonic() + 60
        while not all(os.path.exists(s) for s in socks):
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                raise RuntimeError("a daemon did not come up (its stderr is above)")
            time.sleep(0.05)
        pids = [d.pid for d in daemons]  # `ip netns exec` execs: the daemon is the pid
        if hosts.star:
            link0, drops0 = hosts.link_bytes(pids), hosts.drops(pids + [sw.proc.pid])
        for h in range(H):
            for lr in range(L):
                rank, local = (h, (lr, L)) if mode == "hier" else (h * L + lr, (0, 0))
                procs.append(subprocess.Popen(netns.command(
                    hosts.ns[h], sys.executable, "-m", "bench.hier", "--worker", job_file,
                    rank, socks[h], local[0], local[1], n, calls, h * L + lr, H * L),
                    env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True))
        end = time.monotonic() + timeout
        outs = []
        for i, p in enumerate(procs):
            text = p.communicate(timeout=max(1.0, end - time.monotonic()))[0]
            if p.returncode:
                raise RuntimeError(f"{mode}: training process {i} (host {i // L}) exited "
                                   f"{p.returncode}: its error is above")
            outs.append(json.loads(text))
        if hosts.star:
            link = [(b - a) / calls for a, b in zip(link0, hosts.link_bytes(pids))]
            drops = [b - a for a, b in zip(drops0, hosts.drops(pids + [sw.proc.pid]))]
        counts = sw.stop()
    except Exception:
        if hosts.star and daemons and all(d.poll() is None for d in daemons):
            tbf, udp = hosts.drops([d.pid for d in daemons] + [sw.proc.pid])
            print(f"{mode}: failed; since the namespaces were made: {tbf} packets dropped by "
                  f"tbf, {udp} UDP datagrams dropped by the kernels (receive buffer or IP "
                  f"reassembly)",
                  file=sys.stderr)
        raise
    finally:
        for p in procs + daemons:
            if p.poll() is None:
                p.terminate()
        for p in procs + daemons:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        sw.close()
    # per call: hier: each local process reports its host agent's stats; flat: its own agent's
    per_host = [sum(outs[h * L]["bytes"]) / calls if mode == "hier" else
                sum(sum(o["bytes"]) for o in outs[h * L:(h + 1) * L]) / calls for h in range(H)]
    # hier: the L local processes of a host report the same resends (their one agent's)
    row = {"mode": mode,
           "switch_packets": (counts["packets_in"] + counts["packets_out"]) / calls,
           "switch_bytes": (counts["bytes_in"] + counts["bytes_out"]) / calls,
           "host_bytes": per_host,
           "resends": sum(o["resends"] for o in outs[::L if mode == "hier" else 1]),
           "times": [t for o in outs for t in o["times"][1:]],
           "wrong": sum(o["wrong"] for o in outs)}
    if hosts.star:
        row.update(link_bytes=link, drops=drops)
    return row


DESCRIPTION = "hierarchical reduction through the daemon vs one rank per process"
METHODS = ("flat", "hier")
DEFAULTS = dict(methods="flat,hier", workers="16", densities="1", begin="4M", end="4M",
                repeats=5)
EXTRA_COLUMNS = ("hosts", "local", "switch_packets_per_call", "switch_bytes_per_call",
                 "host_bytes_per_call", "resends", "veth_bytes_per_call", "tbf_drops",
                 "udp_drops")


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--local", type=cli.int_range(1, 64), default=4,
                    help="training processes per host (default %(default)s)")
    ap.add_argument("--rto", type=cli.positive_float, default=0.05,
                    help="the daemons' rto floor in s (default %(default)s)")
    ap.add_argument("--nslots", type=cli.int_range(1, 4096), default=16,
                    help="the jobs' slots: each agent's window of rounds in flight")
    ap.add_argument("--timeout", type=cli.positive_float, default=300,
                    help="seconds a mode's training processes may take in all")


def check_options(a) -> str | None:
    if a.densities != [1.0]:
        return "argument -d/--densities: the tensors are dense (give -d 1)"
    if len(a.workers) != 1 or a.workers[0] % a.local:
        return f"argument -g/--workers: one count, a multiple of --local {a.local}"
    a.hosts = a.workers[0] // a.local
    if a.topo is None:
        return "argument --rates: needs -t/--topology" if a.rates else None
    star = star_of(a.topo)
    if isinstance(star, str):
        return f"argument -t/--topology: {a.topology}: {star}"
    if len(star[1]) != a.hosts:
        return (f"argument -g/--workers: {a.topology} has {len(star[1])} hosts: give -g "
                f"{len(star[1]) * a.local} (--local {a.local})")
    why = netns.why_no_namespaces()
    return f"argument -t/--topology: {why}" if why else None


def run(a, log):
    from contextlib import ExitStack
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        g = None
        if a.topo is not None:
            g = stack.enter_context(Graph(a.topo, a.tag, queue_ms=20))
        for rate in g.each_rate(a.rates) if g is not None else [""]:
            for size in a.sizes:
                yield measure(a, Hosts(a.hosts, g), Path(tmp), size // 4, rate)


def measure(a, hosts: Hosts, tmp: Path, n: int, rate: str) -> list[dict]:
    """Both modes at one size: the harness's rows."""
    load0 = os.getloadavg()[0]
    got = {mode: run_mode(hosts, tmp, mode, a.local, n, a.repeats + 1, job, a.rto, a.timeout,
                          a.nslots)
           for job, mode in enumerate(a.methods, 1)}
    times = {m: r["times"] for m, r in got.items()}
    extras = {m: dict(hosts=hosts.H, local=a.local,
                      switch_packets_per_call=round(r["switch_packets"]),
                      switch_bytes_per_call=round(r["switch_bytes"]),
                      host_bytes_per_call=" ".join(f"{b:.0f}" for b in r["host_bytes"]),
                      resends=r["resends"],
                      veth_bytes_per_call=" ".join(f"{b:.0f}" for b in r.get("link_bytes", [])),
                      tbf_drops=r["drops"][0] if "drops" in r else "",
                      udp_drops=r["drops"][1] if "drops" in r else "") for m, r in got.items()}
    point = dict(size=4 * n, elements=n, dtype="float32", density=1.0,
                 workers=hosts.H * a.local, lane_bits=32, rate=rate)
    return method_rows(a.what, point, times, bus="all_reduce",
                       sent={m: round(statistics.fmean(r["host_bytes"])) for m, r in got.items()},
                       wrong={m: r["wrong"] for m, r in got.items()},
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)


if __name__ == "__main__":  # a training process (run_mode starts them)
    a = sys.argv[1:]
    if a and a[0] == "--worker":
        worker(a[1], int(a[2]), a[3], int(a[4]), int(a[5]), int(a[6]), int(a[7]), int(a[8]),
               int(a[9]))
