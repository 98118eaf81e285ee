"""reduce_scatter: the reduce-scatter through the switch (Agent.reduce_scatter,
docs/protocol.md "Reduce-scatter") against gloo's reduce_scatter_tensor, paired, in the same
processes, on loopback or a star topology file in namespaces.

    python -m bench reduce_scatter -b 64K -e 8M -f 4 -d 1,0.01 -g 4              # loopback
    python -m bench reduce_scatter -t bench/topologies/star4.yaml --rates 1gbit  # root

Every rank is a process holding a SpINA Agent and a gloo group (bench.paired.Cluster); the
software switch runs in a process of its own (with -t in the aggregating switch's namespace,
which routes gloo's TCP too, so both methods cross the same links). size is nccl-tests' for
reduce-scatter: the whole input tensor (each rank gets size / workers bytes of the sum).
Data: bench/procs.py's float32 tensors, a fraction `density` of their 256-element blocks
non-zero. Per size the methods alternate repeat by repeat after a warm-up, between barriers,
only the collective timed:

  spina   Agent.reduce_scatter(x): every rank sends its non-zero blocks (of its lanes' width),
          receives its own shard's rounds whole and the others' as headers
  gloo    dist.reduce_scatter_tensor(out, t): dense float32; gloo runs it as an all-reduce
          and keeps the rank's part (its link counters on the star read 2(n-1)/n of the tensor
          each way, an all-reduce's ring, not a ring reduce-scatter's (n-1)/n)

No floor: bench/floor.py's star all-reduce multicasts the whole sum, it is no reduce-scatter.
Every rank's shard is checked against numpy's float64 sum (SpINA within the quantization
bound of its lanes, gloo within float32 rounding); `wrong` counts the calls that failed.
bytes_per_link: on a topology the link-layer bytes the rank's interface sent per call
(rx_bytes_per_link: received), on loopback SpINA's UDP payload as the agent counted it and
gloo's from its algorithm (2(n-1)/n of the tensor each way, as measured on a star);
`bytes_source` says which. scan_ms ... rounds_per_slot: SpINA's call timeline, as
bench/all_reduce.py's (CallStats.phases, medians over every rank's timed calls;
docs/profile.md "A sparse call's timeline").
"""
from __future__ import annotations

import os
import statistics
import time
import warnings

from bench.all_reduce import PHASE_COLUMNS, nlanes_for, phase_medians
from bench.harness import method_rows
from bench.paired import proc_cpu, star_clusters
from bench.procs import Expected, Point, check_result, expected_sum, make_tensor

DESCRIPTION = "reduce-scatter through the switch vs gloo's reduce_scatter_tensor, paired"
METHODS = ("spina", "gloo")
DEFAULTS = dict(methods="spina,gloo", begin="64K", end="8M")
EXTRA_COLUMNS = ("shard_bytes", "bytes_source", "rx_bytes_per_link", "packets_per_link",
                 "resends", "max_abs_err", "tbf_drops", "switch_cpu_s_per_call") + PHASE_COLUMNS
GLOO_PORT = 29541


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--nslots", type=cli.int_range(1, 4096), default=16,
                    help="switch slots per job: the window (default %(default)s)")


def check_options(a) -> str | None:
    from bench.net_topo import check_star
    if a.topo is None:
        return "argument --rates: needs -t/--topology (loopback has no links)" if a.rates \
            else None
    return check_star(a)


def serve(rank, req, agent, dist, torch, barrier, floor=None) -> dict:
    """A rank's side of one point: {method: {times, tx, rx, ...}} (see the module's doc)."""
    from bench.net_topo import dev_bytes
    from host_agent.scatter import shard_bounds
    p, repeats, methods = req["point"], req["repeats"], req["methods"]
    n, bits = p.workers, agent.job.lane_bits
    x = make_tensor(p, rank)
    lo, hi = shard_bounds(p.elements, n, rank)
    full = expected_sum(p)
    want = Expected(full.total[lo:hi], full.abssum[lo:hi], full.maxabs)
    t = torch.from_numpy(x)
    out = torch.empty(hi - lo, dtype=torch.float32)
    calls = {"spina": lambda: agent.reduce_scatter(x),
             "gloo": lambda: (dist.reduce_scatter_tensor(out, t), out.numpy())[1]}
    # torch 2.13 calls reduce_scatter_tensor deprecated (for reduce_scatter_single): it is the
    # call FSDP2 and issue 45 compare with, so it stays, without a warning per call
    warnings.filterwarnings("ignore", "`torch.distributed.reduce_scatter_tensor` is deprecated",
                            FutureWarning)
    count = req["count_dev"]
    rec = {m: dict(times=[], tx=[], rx=[], packets=[], resends=[], phases=[], rounds=[],
                   max_err=0.0, wrong=0) for m in methods}
    for i in range(repeats + 1):  # i == 0: warm-up, checked, not recorded
        for m in methods if i % 2 == 0 else methods[::-1]:
            barrier.wait()  # the last call is over everywhere: the links are quiet
            tx0, rx0 = dev_bytes() if count else (0, 0)
            barrier.wait()
            t0 = time.perf_counter()
            got = calls[m]()
            dt = time.perf_counter() - t0
            barrier.wait()  # every rank done: late resends are counted with this call
            tx1, rx1 = dev_bytes() if count else (0, 0)
            r = rec[m]
            try:
                r["max_err"] = max(r["max_err"], check_result(got, want, n, m == "spina", bits))
            except AssertionError as e:
                r["wrong"] += 1
                r.setdefault("first_wrong", f"{m}: {e}")
            if not i:
                continue
            r["times"].append(dt)
            if m == "spina":
                st = agent.last_stats
                r["packets"].append(st.packets_sent)
                r["resends"].append(st.resends)
                r["phases"].append(st.phases)  # the call's timeline (bench.all_reduce's)
                r["rounds"].append(st.rounds)
                if not count:
                    tx1, rx1 = st.bytes_sent, st.bytes_received
            elif not count:  # gloo's all-reduce ring: 2(n-1)/n of the tensor out and in
                tx1 = rx1 = 4 * p.elements * 2 * (n - 1) // n
            r["tx"].append(tx1 - tx0)
            r["rx"].append(rx1 - rx0)
    return rec


def run(a, log):
    """Rows per point: per (workers, lane bits) one cluster; per rate, density and size a
    point measured in it."""
    nlanes = nlanes_for(256)
    for cl, n, bits, graph, rate in star_clusters(a, GLOO_PORT, log, nslots=a.nslots,
                                                  nlanes=nlanes, serve=serve):
        for d in a.densities:
            for size in a.sizes:
                p = Point(a.what, n, size // 4, d, 256, nlanes, 256, a.nslots)
                yield measure(cl, graph, a, p, bits, rate)


def measure(cl, graph, a, p: Point, bits: int, rate) -> list[dict]:
    methods = tuple(a.methods)
    load0, cpu0 = os.getloadavg()[0], proc_cpu(cl.switch_pid)
    drops0 = graph.tbf_drops() if graph is not None else 0
    recs = cl.ask(dict(point=p, repeats=a.repeats, methods=methods,
                       count_dev=graph is not None), f"{4 * p.elements} B")
    # the switch process works for SpINA alone (gloo's TCP is routed by the kernel)
    switch_cpu = (proc_cpu(cl.switch_pid) - cpu0) / (a.repeats + 1)
    drops = graph.tbf_drops() - drops0 if graph is not None else ""
    times, sent, wrong, extras = {}, {}, {}, {}
    mean = lambda m, k: statistics.mean(statistics.mean(r[m][k]) for r in recs)  # noqa: E731
    for m in methods:
        times[m] = [max(r[m]["times"][i] for r in recs) for i in range(a.repeats)]
        sent[m] = round(mean(m, "tx"))
        wrong[m] = sum(r[m]["wrong"] for r in recs)
        spina = m == "spina"
        extras[m] = dict(shard_bytes=4 * -(-p.elements // p.workers),
                         bytes_source="link counters" if graph is not None else
                         "measured" if spina else "model",
                         rx_bytes_per_link=round(mean(m, "rx")),
                         packets_per_link=round(mean(m, "packets")) if spina else "",
                         resends=sum(sum(r[m]["resends"]) for r in recs) if spina else "",
                         max_abs_err=max(r[m]["max_err"] for r in recs), tbf_drops=drops,
                         switch_cpu_s_per_call=round(switch_cpu, 4) if spina else "",
                         **(phase_medians(recs, m, p.nslots) if spina else {}))
    firsts = [r[m]["first_wrong"] for r in recs for m in methods if "first_wrong" in r[m]]
    if firsts:
        print(f"reduce_scatter: wrong results, first: {firsts[0]}", flush=True)
    point = dict(size=4 * p.elements, elements=p.elements, dtype="float32", density=p.density,
                 workers=p.workers, lane_bits=bits, rate=rate)
    return method_rows(a.what, point, times, bus="reduce_scatter", sent=sent, wrong=wrong,
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)

