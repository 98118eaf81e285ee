"""Hierarchical reduction through the daemon vs one rank per process, on loopback or over
rate-limited links between network namespaces.

    python -m bench.hier_bench [--hosts 4] [--local 4] [--elements N] [--calls C]
    python -m bench.hier_bench --topology bench/topologies/star4.yaml [--rate 1gbit] [--tag T]
                                                                      # as root
    ... [--nslots 16] [--modes flat,hier]   # each agent's window; one mode alone

H "hosts" are H daemon processes (`python -m host_agent daemon`, each its own socket), each
with L training processes (DaemonClients, one process each); one software switch (a process
of its own, bench.procs.switch_main, one per mode). `flat`: every process is its own rank of
an H*L-rank job (today's mode); `hier`: the L processes of a host are local ranks of one rank
of an H-rank job (host_agent/daemon/hier.py). Both sum the same dense float32 tensors.

On loopback every process is in this namespace. With --topology (a star file: one aggregating
switch, a link per host; its hosts are the H hosts) each host is a namespace of the file built
by bench/net_topo.py's Graph, its one veth to the switch namespace limited by tbf to the
file's rate (or --rate) in both directions; the host's daemon and its L training processes
run in its namespace (the daemon's unix socket is on the shared filesystem), the job's worker
addresses are the hosts' namespace addresses, and the switch runs in the switch namespace.
Everything is removed on exit, also on errors.

Printed per mode: the switch's datagrams and bytes in+out per call (exact counts), the bytes
each host's agents put on and took off its link per call (exact UDP payload; with --topology also
the veth's own tx+rx bytes, headers and IP fragments included, and the tbf and kernel UDP
drops), and the median call time of the calls after the first (wall clock: the load average
is printed too). docs/collectives.md shows runs.
"""
from __future__ import annotations

import argparse
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

from bench.net_topo import (
    Graph,
    dev_bytes,
    kernel_losses_total,
    parse_rate,
    star_of,
    tbf_params,
)
from bench.paired import stop_all
from bench.procs import switch_main
from host_agent.launch import local_job
from spina import cli, netns
from spina.config import JobConfig, JobFile, WorkerAddr

ROOT = Path(__file__).resolve().parents[1]


def worker(job_file: str, rank: int, sock: str, local_rank: int, local_size: int, n: int,
           calls: int, seed: int) -> None:
    """One training process: `calls` all-reduces; prints its times and last stats as JSON."""
    from host_agent.daemon import DaemonClient
    x = (np.random.default_rng(seed).random(n) + 0.5).astype(np.float32)
    kw = dict(local_rank=local_rank, local_size=local_size) if local_size else {}
    times, nbytes, resends = [], [], 0
    with DaemonClient(job_file, rank, sock, **kw) as c:
        for _ in range(calls):
            t0 = time.perf_counter()
            c.allreduce(x)
            times.append(time.perf_counter() - t0)
            nbytes.append(c.last_stats.bytes_sent + c.last_stats.bytes_received)
            resends += c.last_stats.resends
    print(json.dumps({"times": times, "bytes": nbytes, "resends": resends}), flush=True)


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
                    hosts.ns[h], sys.executable, "-m", "bench.hier_bench", "--worker", job_file,
                    rank, socks[h], local[0], local[1], n, calls, h * L + lr),
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
           "median_ms": 1e3 * statistics.median(t for o in outs for t in o["times"][1:])}
    if hosts.star:
        row.update(link_bytes=link, drops=drops)
    return row


def measure(args, hosts: Hosts) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return [run_mode(hosts, Path(tmp), mode, args.local, args.elements, args.calls, job,
                         args.rto, args.timeout, args.nslots)
                for job, mode in enumerate(args.modes, 1)]


def _rate(text: str) -> str:
    """--rate: one tc rate, checked here so that a bad one is a usage error (exit 2)."""
    try:
        parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        a = argv[1:]
        worker(a[0], int(a[1]), a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]), int(a[7]))
        return 0
    ap = cli.ArgumentParser(prog="python -m bench.hier_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--local", type=int, default=4, help="training processes per host")
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--rto", type=float, default=0.05, help="the daemons' rto floor (s)")
    ap.add_argument("--nslots", type=int, default=16,
                    help="the jobs' slots: each agent's window of rounds in flight")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds a mode's training processes may take in all")
    ap.add_argument("--topology", default=None,
                    help="a star topology file: its hosts in network namespaces with its "
                    "rate-limited links (root; --hosts is then its hosts)")
    ap.add_argument("--rate", type=_rate, default=None,
                    help="with --topology: each link's rate instead of the file's (tc units)")
    ap.add_argument("--tag", default=None,
                    help="with --topology: prefix of the namespace names")
    ap.add_argument("--modes", type=lambda v: v.split(","), default=["flat", "hier"],
                    help="flat,hier (default), or one of them")
    args = ap.parse_args(argv)
    if not args.modes or not set(args.modes) <= {"flat", "hier"} or len(set(args.modes)) < len(
            args.modes):
        ap.error(f"--modes: flat, hier or both, got {','.join(args.modes)}")
    for name in ("hosts", "local", "elements", "calls", "nslots"):
        if getattr(args, name) < (2 if name == "calls" else 1):
            ap.error(f"--{name}: too small: {getattr(args, name)}")
    load0 = os.getloadavg()
    where = "loopback"
    if args.topology:
        from collectives.topology import TopologyError, load
        try:
            topo = load(args.topology)
        except TopologyError as e:
            ap.error(f"argument --topology: {cli.one_line(e)}")
        star = star_of(topo)
        if isinstance(star, str):
            ap.error(f"argument --topology: {args.topology}: {star}")
        why = netns.why_no_namespaces()
        if why:
            print(f"--topology: {why}", file=sys.stderr)
            return 2
        args.hosts = len(star[1])
        with Graph(topo, args.tag or netns.unique_tag("hb"), queue_ms=20) as g:
            if args.rate:
                g.set_rate(args.rate)
            rate = g.file_rate()
            rows = measure(args, Hosts(args.hosts, g))
        tbf = tbf_params(rate, topo.mtu)
        where = (f"namespaces of {args.topology}, {rate} links (tbf both ways, burst at least "
                 f"{tbf['burst']} B, queue 20 ms), MTU {topo.mtu}")
    else:
        rows = measure(args, Hosts(args.hosts))
    load1 = os.getloadavg()
    print(f"{args.hosts} hosts x {args.local} processes, {where}, {args.elements} float32 "
          f"elements (dense), {args.calls} calls, {args.nslots} slots a job, rto {args.rto} s; "
          f"load average "
          f"{load0[0]:.2f} at start, {load1[0]:.2f} at end, {os.cpu_count()} cores")
    veth = bool(args.topology)
    print("| mode | switch datagrams/call | switch bytes/call | agents' bytes on each host's "
          "link/call " + ("| veth bytes of each host/call | tbf / UDP drops (all calls) " if veth
                        else "")
          + "| resends (all calls) | median call (ms) |")
    print("|---|---|---|---|---|---|" + ("---|---|" if veth else ""))
    for r in rows:
        extra = (f"{', '.join(f'{b:.0f}' for b in r['link_bytes'])} | {r['drops'][0]} / "
                 f"{r['drops'][1]} | "
                 if veth else "")
        print(f"| {r['mode']} | {r['switch_packets']:.0f} | {r['switch_bytes']:.0f} | "
              f"{', '.join(f'{b:.0f}' for b in r['host_bytes'])} | {extra}{r['resends']} | "
              f"{r['median_ms']:.1f} |")
    if len(rows) < 2:
        return 0
    f, h = rows
    print(f"hier/flat: switch datagrams {h['switch_packets'] / f['switch_packets']:.4f}, "
          f"bytes {h['switch_bytes'] / f['switch_bytes']:.4f}, host link bytes "
          f"{sum(h['host_bytes']) / sum(f['host_bytes']):.4f}"
          + (f", veth bytes {sum(h['link_bytes']) / sum(f['link_bytes']):.4f}" if veth else "")
          + f", call time {h['median_ms'] / f['median_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
