"""One run: the fabric built, every process started, the configurations stepped (or trained)
one after another, every process stopped and the fabric removed whatever happens."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

from bench.dlcp_bench.configs import CONFIGS, JOB
from bench.dlcp_bench.fabric import GLOO_PORT, NLANES, Fabric
from bench.dlcp_bench.model import VARIANTS, layer_sizes
from bench.dlcp_bench.report import step_row, summarize
from bench.dlcp_bench.switches import aggregator_main, background_main, leaf_main
from bench.dlcp_bench.worker import worker_main
from bench.paired import recv, stop_all


def run(a) -> tuple[list[dict], list[dict], dict]:
    """Build the fabric, start every process, run the steps; (step rows, summary rows, meta)."""
    sizes = layer_sizes(a.model)
    n = a.workers
    step_rows: list[dict] = []
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    sw_conn = leaf_conn = bg_conn = None
    with Fabric(n, a.tag, a.rate) as fab:
        try:
            sw_conn, child = ctx.Pipe()
            procs.append(ctx.Process(target=aggregator_main, name="dlcp-aggregator",
                                     args=(child, fab.core, fab.core_ip)))
            procs[-1].start()
            switch_addr = recv(sw_conn, "aggregator", 60)
            leaf_conn, child = ctx.Pipe()
            procs.append(ctx.Process(target=leaf_main, name="dlcp-leaf",
                                     args=(child, fab.leaf, fab.ports("leaf"),
                                           fab.l2_entries(), fab.uplink, uplink_spec(a),
                                           a.qdepth)))
            procs[-1].start()
            recv(leaf_conn, "leaf", 60)
            barrier = ctx.Barrier(n)
            gloo_port = GLOO_PORT
            for r in range(n):
                parent, child = ctx.Pipe()
                procs.append(ctx.Process(target=worker_main, name=f"dlcp-worker{r}",
                                         args=(r, fab.worker_ns(r), n, sizes, gloo_port, child,
                                               barrier, fab.worker_ip(r), fab.worker_ip(0),
                                               fab.host_if(f"w{r}"))))
                procs[-1].start()
                conns.append(parent)
            from spina.config import JobConfig, WorkerAddr
            addrs = [recv(c, f"rank {r} start", 120) for r, c in enumerate(conns)]
            job = JobConfig(job=JOB, workers=tuple(WorkerAddr(r, h, p) for r, (h, p)
                                                   in enumerate(addrs)),
                            nslots=a.nslots, block_size=256, nlanes=NLANES,
                            loss_deadline=a.loss_deadline).validate()
            sw_conn.send(job)
            recv(sw_conn, "aggregator admission", 60)
            for c in conns:
                c.send((job, switch_addr))
            for r, c in enumerate(conns):
                recv(c, f"rank {r} ready", 300)
            bg_conn, child = ctx.Pipe()
            procs.append(ctx.Process(target=background_main, name="dlcp-background",
                                     args=(child, fab.bg, fab.bg_ip, a.background,
                                           a.bg_size)))
            procs[-1].start()
            recv(bg_conn, "background", 60)
            configs = [c for c in CONFIGS if c.name in a.configs]
            t_start = time.time()
            if a.train:
                train = []
                for cfg in configs:
                    leaf_conn.send(("bound", cfg.bounded_loss if cfg.method == "spina" else 0))
                    recv(leaf_conn, "leaf bound", 30)
                    leaf_conn.send("counters")
                    c0 = recv(leaf_conn, "leaf counters", 30)
                    load = os.getloadavg()[0]
                    for c in conns:
                        c.send((cfg, "train", a.train_model, a.train, a.eval_every, 32,
                                a.lr))
                    recs = [recv(c, f"rank {r} training {cfg.name}", 3600)
                            for r, c in enumerate(conns)]
                    leaf_conn.send("counters")
                    c1 = recv(leaf_conn, "leaf counters", 30)
                    train.append(dict(config=cfg.name, recs=recs, drops=c1[0] - c0[0],
                                      load=(load, os.getloadavg()[0])))
                    print(f"  {cfg.name:>15}: {max(r['seconds'] for r in recs):.1f} s, "
                          f"accuracy {recs[0]['curve'][-1][2]:.2f}%", flush=True)
                bg_conn.send("stop")
                bg_sent = recv(bg_conn, "background stop", 30)
                bg_conn.close()
                return train, [], dict(sizes=layer_sizes(a.train_model), job=job,
                                       bg_sent=bg_sent, seconds=time.time() - t_start)
            for rep in range(a.steps + 1):  # repeat 0: warm-up, checked but not recorded
                order = configs[rep % len(configs):] + configs[:rep % len(configs)]
                for k, cfg in enumerate(order):
                    if cfg.method == "spina":
                        leaf_conn.send(("bound", cfg.bounded_loss))
                        recv(leaf_conn, "leaf bound", 30)
                    leaf_conn.send("counters")
                    c0 = recv(leaf_conn, "leaf counters", 30)
                    load = os.getloadavg()[0]
                    for c in conns:
                        c.send((cfg, rep % VARIANTS))
                    recs = [recv(c, f"rank {r} step {rep} {cfg.name}", 600)
                            for r, c in enumerate(conns)]
                    leaf_conn.send("counters")
                    c1 = recv(leaf_conn, "leaf counters", 30)
                    row = step_row(rep, k, cfg, recs, c0, c1, load, sizes)
                    if rep:
                        step_rows.append(row)
                    if a.verbose or not rep:
                        print(f"  {'warm-up' if not rep else f'step {rep}'} {cfg.name:>11}: "
                              f"{row['step_s']:.3f} s, lost {row['blocks_lost']} "
                              f"(wrong {row['wrong_blocks']}), drops congestion "
                              f"{row['congestion_drops']} tail {row['tail_drops']}, "
                              f"load {load:.1f}", flush=True)
                if rep and rep % 5 == 0:
                    print(f"  {rep}/{a.steps} repeats, {time.time() - t_start:.0f} s",
                          flush=True)
            bg_conn.send("stop")
            bg_sent = recv(bg_conn, "background stop", 30)
            bg_conn.close()
            meta = dict(sizes=sizes, job=job, bg_sent=bg_sent, seconds=time.time() - t_start)
        finally:
            for c in conns:
                try:
                    c.send("stop")
                except OSError:
                    pass
            for c in (bg_conn, leaf_conn, sw_conn):
                if c is not None and not c.closed:
                    try:
                        c.send("stop")
                    except OSError:
                        pass
            stop_all(procs)
    return step_rows, summarize(step_rows, a, sizes), meta


def uplink_spec(a) -> tuple:
    """What leaf_main sets on the uplink, from the options."""
    return ("shaper", a.port_rate) if a.uplink == "shaper" else ("bmv2", a.queue_rate)
