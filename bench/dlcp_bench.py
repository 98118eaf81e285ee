"""DLCP under congestion: step time of one gradient all-reduce per step, exact vs bounded loss,
fixed vs layer priorities, and gloo, over the same congested queue (docs/dlcp.md).

Run from the repository root as root (`make bench-dlcp` does):

    python -m bench.dlcp_bench                                  # the documented run (2.5 min)
    python -m bench.dlcp_bench --workers 2 --model 64,64,10 --steps 2 --out /tmp/d   # smoke

The fabric (namespaces, built and removed by this module):

```
  w0 eth0 -tbf-+                               +- core: IPv4 router between the workers'
  w1 eth0 -tbf-+ leaf: L2-mode software switch |  subnets (gloo's ring), SpINA's aggregator
  ...          + (softswitch.l2), its uplink  -+  (UDP-mode software switch) on 10.210.255.1,
  bg eth0 -tbf-+ rate-limited (--port-rate)    |  a blackhole for the background traffic
```

Every frame a worker sends goes through the leaf's uplink to the core (the leaf bridges by MAC
and every worker's next hop is the core): SpINA's contributions on their way to the aggregator,
and gloo's TCP ring (worker -> core -> worker). The uplink's egress is the one congested port:
the leaf's per-priority queues (softswitch/egress.py), tail drop at 64 frames per queue,
enq_qdepth measured, and the DLCP congestion drop with the job's loss budget (the `congestion`
entry the controller writes, set here per mode). By default (`--uplink shaper`) the port is
one link of `--port-rate` (bits/s on the wire) with strict priority between its queues, and a
frame's link time is taken when it leaves egress, so a frame the congestion drop takes uses
none: a real port. `--uplink bmv2` is BMv2's traffic manager instead (the first run in
docs/dlcp.md): each priority queue drained at `--queue-rate` frames a second on its own, the
drop decided after the frame's departure slot. The background sender (its own namespace)
sends UDP open loop at `--background` frames a second of `--bg-size` bytes through the same
uplink to a blackholed address at the core:
non-INA frames, so priority 0, the queue SpINA's loss-tolerant packets (and, with priority
policy `fixed`, all of them) and gloo share. Worker links are limited by tbf both ways.

`--train STEPS` measures time to accuracy instead: every worker trains an MLP on
scikit-learn's digits (`--train-model`, default 64,1024,512,10), its own shard, one
all-reduce per layer per step, through the same fabric, one configuration after another;
rank 0 evaluates every `--eval-every` steps (the clock stops meanwhile). Outputs
dlcp_train.csv (per configuration: the seconds and steps to `--target-accuracy`, the
losses), dlcp_train_curves.csv, dlcp_train.png.

Per step, every worker all-reduces one gradient of an MLP (`--model` widths), one call per
layer in backward order (last layer first, as DDP's buckets), each with its layer position
(`layer=(i, n)`, 0 = the first layer, needed first by the next forward pass). Configurations,
interleaved step by step (the order rotating each repeat), in the same processes:

  exact/fixed, exact/layer                bounded_loss 0 (priority_policy fixed, layer)
  exact/own-queue                         a control: exact, the job's priority 1, so every
                                          packet in a queue of its own (not the background's)
  b1%/fixed, b1%/layer, b10%/fixed, ...   bounded_loss 0.01, 0.1, loss_tolerant_policy magnitude
                                          (loss deadline: --loss-deadline)
  b1%/fixed/auto, ..., b10%/layer/auto    the same with loss_deadline auto (from the measured
                                          round latency)
  gloo                                    torch.distributed gloo all_reduce, in place, per layer

A step's time is the slowest worker's (barriers around it). Checked per step: SpINA's results
bit-identical on every rank; rank 0 counts the blocks of each call's result that differ from
the exact float64 sum by more than the quantization bound (exact modes: none, else the run
fails; bounded modes: recorded with `within_bound`, floor(bound x the call's blocks)); gloo
within float32 rounding. Recorded per step: CallStats (blocks lost, partial
rounds, loss-tolerant packets, resends), the leaf's congestion drops and tail drops, the load
average. Outputs in --out: dlcp_steps.csv (every step), dlcp_congestion.csv (per
configuration), dlcp_summary.md, dlcp_congestion.png.
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from bench.net_topo import parse_rate, tbf_params
from bench.paired import BenchError, guarded, recv, stop_all
from spina import netns, spec

NET = "10.210"
CORE_IP = f"{NET}.255.1"          # the aggregator's address (on the core's lo)
BG_NET, BLACKHOLE = 250, f"{NET}.254.1"
CORE_MAC = "02:00:00:00:03:00"
UPLINK = 100                      # the leaf's port toward the core
WORKER_PORT, GLOO_PORT = 50000, 29500
JOB = 1
MTU = 9000                        # jumbo frames: one SpINA datagram of 8 blocks of 256 per frame
NLANES = 8                        # 8 x 1 KiB blocks + header < 9000: no IP fragmentation
TARGET = 0.5                      # issue 14: p99 with a 10% bound <= half of exact mode's


@dataclass(frozen=True)
class Config:
    """One configuration of the experiment."""
    name: str
    method: str                   # "spina" or "gloo"
    bounded_loss: float = 0.0
    priority_policy: str = "fixed"
    loss_tolerant_policy: str = "none"
    priority: int = 0             # the job's priority (queue); background traffic is in 0
    loss_deadline: float | str | None = None  # None: --loss-deadline


CONFIGS = (Config("exact/fixed", "spina"), Config("exact/layer", "spina", priority_policy="layer"),
           # a control: every packet in a queue of its own, apart from the background's
           Config("exact/own-queue", "spina", priority=1),
           Config("b1%/fixed", "spina", 0.01, "fixed", "magnitude"),
           Config("b1%/layer", "spina", 0.01, "layer", "magnitude"),
           Config("b10%/fixed", "spina", 0.1, "fixed", "magnitude"),
           Config("b10%/layer", "spina", 0.1, "layer", "magnitude"),
           Config("gloo", "gloo"),
           # the loss deadline from the measured round latency (JobConfig loss_deadline auto)
           *(Config(f"b{b:.0%}/{pol}/auto", "spina", b, pol, "magnitude", loss_deadline="auto")
             for b in (0.01, 0.1) for pol in ("fixed", "layer")))
DEFAULT_CONFIGS = tuple(c.name for c in CONFIGS)
STEP_COLUMNS = ("repeat", "order", "config", "step_s", "worker_max_s", "worker_min_s",
                "blocks", "blocks_lost", "wrong_blocks", "partial_rounds",
                "loss_tolerant_packets", "resends", "timeout_resends", "loss_deadline_ms",
                "congestion_drops",
                "congestion_seen", "tail_drops", "load1")
COLUMNS = ("config", "method", "bounded_loss", "priority_policy", "loss_tolerant_policy",
           "workers", "elements", "layers", "steps", "median_s", "p90_s", "p99_s", "min_s",
           "max_s", "spread_p99_over_median", "p99_vs_exact_fixed", "blocks_per_step",
           "blocks_lost_per_call", "blocks_lost_max_per_call", "wrong_blocks_per_call",
           "wrong_blocks_max_per_call", "bound_blocks_per_call", "partial_rounds_per_step",
           "loss_tolerant_packets_per_step", "resends_per_step", "loss_deadline_ms",
           "congestion_drops_per_step",
           "tail_drops_per_step", "load_min", "load_max", "within_bound", "verified")


# ----------------------------------------------------------------------------- the fabric
def worker_ip(r: int) -> str:
    return f"{NET}.{r}.2"


def worker_mac(r: int) -> str:
    return f"02:00:00:00:02:{r:02x}"


BG_IP, BG_MAC = f"{NET}.{BG_NET}.2", "02:00:00:00:02:fe"


class Fabric(netns.Network):
    """The namespaces of the module docstring; a context manager that removes all it made."""

    def __init__(self, n: int, tag: str, rate: str):
        if not 1 <= n <= 200:
            raise ValueError(f"workers: need 1..200, got {n}")
        super().__init__()
        self.n, self.tag, self.rate = n, tag, rate
        self.leaf, self.core, self.bg = f"{tag}-leaf", f"{tag}-core", f"{tag}-bg"

    def worker_ns(self, r: int) -> str:
        return f"{self.tag}-w{r}"

    def ports(self) -> dict[int, str]:
        """The leaf's ports: worker r on r+1, the background sender on n+1, the uplink."""
        p = {r + 1: f"p{r}" for r in range(self.n)}
        p[self.n + 1] = "pbg"
        p[UPLINK] = "pup"
        return p

    def l2_entries(self) -> dict[str, int]:
        """dst MAC -> leaf port."""
        e = {worker_mac(r): r + 1 for r in range(self.n)}
        e[BG_MAC] = self.n + 1
        e[CORE_MAC] = UPLINK
        return e

    def __enter__(self) -> "Fabric":
        with self.building():
            self._build()
        return self

    @staticmethod
    def _plain(ns: str, ifc: str) -> None:
        """No offloads: the leaf reads frames with raw sockets and must see MTU-sized frames
        (TSO/GSO/GRO would hand it 64 KB super-frames it cannot send on), with checksums."""
        netns.offload_off(ifc, ns, ("tx", "tso", "gso", "gro"))

    def _tbf(self, ns: str, ifc: str) -> None:
        p = tbf_params(self.rate, MTU)
        netns.tbf(ifc, self.rate, p["burst"], p["latency_ms"], ns)

    def _host(self, ns: str, leaf_if: str, ip: str, mac: str, subnet: int) -> None:
        """A host namespace with eth0 on leaf port `leaf_if`, the core as its gateway."""
        self.namespace(ns)
        self.veth(leaf_if, "eth0", a_ns=self.leaf, b_ns=ns)
        netns.set_link("eth0", ns, address=mac, mtu=MTU)
        netns.add_addr("eth0", f"{ip}/24", ns)
        gw = f"{NET}.{subnet}.1"
        netns.static_arp("eth0", gw, CORE_MAC, ns)
        netns.add_route("default", ns, via=gw)
        netns.set_link(leaf_if, self.leaf, mtu=MTU)
        for where, ifc in ((ns, "eth0"), (self.leaf, leaf_if)):
            self._plain(where, ifc)
            self._tbf(where, ifc)
        # the core: this host's subnet, its MAC (no ARP crosses the leaf: static entries)
        netns.add_addr("up0", f"{gw}/24", self.core)
        netns.static_arp("up0", ip, mac, self.core, replace=True)

    def _build(self) -> None:
        self.namespace(self.leaf)
        core = self.namespace(self.core)
        self.veth("pup", "up0", a_ns=self.leaf, b_ns=core)
        netns.set_link("pup", self.leaf, mtu=MTU)
        netns.set_link("up0", core, address=CORE_MAC, mtu=MTU)
        self._plain(self.leaf, "pup")
        self._plain(core, "up0")
        netns.add_addr("lo", f"{CORE_IP}/32", core)
        netns.sysctl(core, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                     "net.ipv4.conf.up0.send_redirects=0", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.up0.rp_filter=0")
        # the background's destination: dropped silently by the core's routing
        netns.ip("route", "add", "blackhole", f"{NET}.254.0/24", ns=core)
        for r in range(self.n):
            self._host(self.worker_ns(r), f"p{r}", worker_ip(r), worker_mac(r), r)
        self._host(self.bg, "pbg", BG_IP, BG_MAC, BG_NET)


# ----------------------------------------------------------------------------- the leaf
def leaf_main(conn, ns: str, ports: dict, l2: dict, uplink: tuple, qdepth: int) -> None:
    """The leaf switch in namespace `ns`: L2 bridging, the uplink rate-limited: `uplink` is
    ("shaper", PortRate) (a port shaper: one link rate, strict priority, link time taken after
    egress) or ("bmv2", pps) (BMv2's model: each priority queue at its own rate). Commands on
    `conn`: ("bound", fraction) sets the job's congestion entry (0: none, never dropped);
    "counters" -> (congestion drops, seen, tail drops) so far; "stop"."""
    try:
        from softswitch.dataplane import Dataplane
        from softswitch.l2 import L2Switch
        from spina import spec
        from spina.netns import enter
        enter(ns)
        dp = Dataplane(pool_slots=1)
        for mac, port in l2.items():
            dp.table_add("l2", {"dst_mac": mac}, "bridge", {"port": port})
        if uplink[0] == "shaper":
            dp.set_port_rate(UPLINK, uplink[1])
        else:
            dp.set_queue_rate(UPLINK, uplink[1])
        sw = L2Switch(ports, dp).start()
        conn.send("ready")
    except BaseException as e:
        conn.send(dict(error=f"leaf: {type(e).__name__}: {e}"))
        raise
    lock = dp.pipeline.lock
    try:
        while True:
            cmd = conn.recv()
            if cmd == "stop":
                break
            if cmd == "counters":
                with lock:
                    c = dp.counters
                    conn.send((int(c["job_congestion_drops"][JOB]),
                               int(c["job_congestion_seen"][JOB]), dp.queues.tail_drops))
            else:
                _, fraction = cmd
                with lock:  # the entry the controller's CongestionDrop writes for this job
                    if spec.loss_bound(fraction):
                        dp.table_add("congestion", {"job": JOB}, "set_congestion",
                                     {"qdepth": qdepth, "bound": spec.loss_bound(fraction)})
                    else:
                        dp.table_delete("congestion", {"job": JOB})
                conn.send("ok")
    finally:
        sw.stop()


# ----------------------------------------------------------------------------- aggregator
def aggregator_main(conn, ns: str) -> None:
    """SpINA's UDP-mode software switch in the core namespace on CORE_IP and the INA UDP port
    (the port by which the leaf's parser knows an INA packet: its priority, its congestion
    drop). Protocol: send our address; receive the JobConfig, admit it; "stop"."""
    import threading

    from softswitch.udp import UdpSwitch
    from spina.netns import enter
    try:
        enter(ns)
        sw = UdpSwitch(CORE_IP, spec.INA_UDP_PORT)
        conn.send(sw.address)
        sw.add_job(conn.recv())
        conn.send("admitted")
    except BaseException as e:
        conn.send(dict(error=f"aggregator: {type(e).__name__}: {e}"))
        raise
    t = threading.Thread(target=sw.serve_forever, name="aggregator")
    t.start()
    try:
        conn.recv()  # "stop"
    except EOFError:
        pass
    sw.shutdown()
    t.join()
    sw.sock.close()


# ----------------------------------------------------------------------------- background
def background_main(conn, ns: str, pps: float, size: int) -> None:
    """Open-loop UDP at `pps` datagrams a second from the background namespace to the core's
    blackhole, paced per millisecond, until "stop" (answers the datagrams sent)."""
    import socket

    from spina.netns import enter
    enter(ns)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((BG_IP, 0))
    s.setblocking(False)
    payload = bytes(size)
    sent = 0
    conn.send("ready")
    t0 = time.perf_counter()
    while not conn.poll(0):
        due = int((time.perf_counter() - t0) * pps)
        while sent < due:
            try:
                s.sendto(payload, (BLACKHOLE, 9))
            except (BlockingIOError, OSError):  # full qdisc: the frame is lost, as on a link
                pass
            sent += 1
        time.sleep(0.001)
    conn.recv()
    conn.send(sent)
    s.close()


# ----------------------------------------------------------------------------- gradients
def layer_sizes(widths: list[int]) -> list[int]:
    """Parameters per layer of an MLP (weights + bias): 64,64,10 -> [4160, 650]."""
    return [a * b + b for a, b in zip(widths[:-1], widths[1:])]


def make_gradient(sizes: list[int], rank: int, variant: int) -> list[np.ndarray]:
    """One worker's gradient, one float32 array per layer: normal values whose scale varies
    from block to block (lognormal), as real gradients' magnitudes do, so that the magnitude
    policy has something to rank; each layer's overall scale shrinks with depth."""
    rng = np.random.default_rng([20261201, rank, variant, len(sizes)])
    out = []
    for i, n in enumerate(sizes):
        nb = -(-n // 256)
        scale = np.repeat(rng.lognormal(0.0, 1.0, nb).astype(np.float32), 256)[:n]
        out.append(rng.standard_normal(n, np.float32) * scale * np.float32(0.1 / (i + 1)))
    return out


VARIANTS = 3  # distinct gradients per worker, cycled step by step


# ----------------------------------------------------------------------------- workers
def worker_main(rank: int, ns: str, n: int, sizes: list[int], gloo_port: int, conn,
                barrier) -> None:
    guarded(rank, conn, barrier, _worker, rank, ns, n, sizes, gloo_port, conn, barrier)


def _worker(rank, ns, n, sizes, gloo_port, conn, barrier):
    import dataclasses

    from host_agent import dlcp
    from host_agent.agent import Agent
    from host_agent.recovery import RttEstimator
    from spina.net import bound_udp_socket
    from spina.netns import enter
    enter(ns)
    sock = bound_udp_socket(worker_ip(rank), WORKER_PORT)
    conn.send(sock.getsockname())
    job, switch_addr = conn.recv()
    agent = Agent(job, rank, switch_addr, sock=sock, timeout=60.0)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{worker_ip(0)}:{gloo_port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=300))
    grads = [make_gradient(sizes, rank, v) for v in range(VARIANTS)]
    exact = None
    if rank == 0:  # the exact sums (float64) and |x| sums, to check every result against
        exact = []
        for v in range(VARIANTS):
            per = [make_gradient(sizes, r, v) for r in range(n)]
            exact.append([(sum(g[i].astype(np.float64) for g in per),
                           sum(np.abs(g[i]).astype(np.float64) for g in per),
                           max(float(np.abs(g[i]).max()) for g in per))
                          for i in range(len(sizes))])
    bufs = [np.empty(s, np.float32) for s in sizes]
    tens = [torch.from_numpy(b) for b in bufs]  # same memory: gloo all-reduces in place
    base = job
    # One latency estimator per configuration, as a job running only that configuration
    # would have: the auto loss deadline (and every timer) follows its own rounds, not the
    # previous configuration's (the step-by-step interleaving changes it every step).
    rtts = {}
    conn.send("ready")
    try:
        while True:
            req = conn.recv()
            if req == "stop":
                break
            cfg, variant = req[:2]
            if cfg.method == "spina":
                agent.job = dlcp.with_policy(dataclasses.replace(base, priority=cfg.priority),
                                             cfg.bounded_loss, cfg.priority_policy,
                                             cfg.loss_tolerant_policy, cfg.loss_deadline)
                agent.rtt = rtts.setdefault(cfg.name, RttEstimator(agent.rtt.min_rto))
            if variant == "train":
                conn.send(_train(rank, n, cfg, agent, dist, barrier, *req[2:]))
                continue
            conn.send(_step(rank, n, cfg, agent, dist, grads[variant], bufs, tens,
                            exact[variant] if exact else None, barrier))
    finally:
        dist.destroy_process_group()
        agent.close()


def _step(rank, n, cfg, agent, dist, grad, bufs, tens, exact, barrier) -> dict:
    """One step: every layer's gradient all-reduced, last layer first."""
    nl = len(bufs)
    for b, g in zip(bufs, grad):
        np.copyto(b, g)
    stats = dict(blocks=0, blocks_lost=0, partial_rounds=0, loss_tolerant_packets=0,
                 resends=0, timeout_resends=0, calls_lost=[], deadlines=[])
    barrier.wait()
    t0 = time.perf_counter()
    for i in reversed(range(nl)):  # backward: the last layer's gradient is ready first
        if cfg.method == "spina":
            agent.allreduce(bufs[i], inplace=True, layer=(i, nl))
            s = agent.last_stats
            stats["calls_lost"].append(s.blocks_lost)
            stats["deadlines"].append(s.loss_deadline)
            for k in ("blocks_lost", "partial_rounds", "loss_tolerant_packets", "resends",
                      "timeout_resends"):
                stats[k] += getattr(s, k)
        else:
            dist.all_reduce(tens[i])
    dt = time.perf_counter() - t0
    barrier.wait()
    stats.update(time=dt, crc=0, wrong=[], max_err=0.0)
    for b in bufs:
        stats["blocks"] += -(-len(b) // 256)
        stats["crc"] = zlib.crc32(b.view(np.uint8), stats["crc"])
    if exact is not None:
        for b, (total, abssum, maxabs) in zip(bufs, exact):
            err = np.abs(b.astype(np.float64) - total)
            bound = abssum * (n * 2.0 ** -23)
            if cfg.method == "spina":  # the quantization step (bench/procs.check_result)
                e = int(np.frexp(maxabs)[1])
                bound = bound + n * 2.0 ** (e + (int(np.ceil(np.log2(n))) if n > 1 else 0) - 31)
            bad = ~(err <= bound)
            pad = (-len(b)) % 256
            wrong = np.pad(bad, (0, pad)).reshape(-1, 256).any(axis=1)
            stats["wrong"].append(int(np.count_nonzero(wrong)))
            ok = ~bad
            stats["max_err"] = max(stats["max_err"], float(err[ok].max()) if ok.any() else 0.0)
        stats["wrong"].reverse()  # in call order (last layer first), as calls_lost
    return stats


# ----------------------------------------------------------------------------- training
def digits(seed: int = 0):
    """scikit-learn's digits (1797 8x8 images), pixels 0..1, an 80/20 split (as
    examples/dlcp_train.py)."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.images.reshape(len(d.images), -1) / 16.0).astype(np.float32)
    perm = np.random.default_rng(seed).permutation(len(x))
    nt = len(x) // 5
    return x[perm[nt:]], d.target[perm[nt:]], x[perm[:nt]], d.target[perm[:nt]]


def mlp_init(widths: list[int], seed: int) -> list[np.ndarray]:
    """One flat float32 array per layer: weights (in x out, He) then bias (zeros)."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([(rng.standard_normal(a * b) * np.sqrt(2 / a)).astype(np.float32),
                            np.zeros(b, np.float32)]) for a, b in zip(widths[:-1], widths[1:])]


def _layers(params, widths):
    return [(p[:a * b].reshape(a, b), p[a * b:]) for p, a, b in
            zip(params, widths[:-1], widths[1:])]


def mlp_grad(params, widths, x, y) -> list[np.ndarray]:
    """Cross-entropy gradient of the ReLU MLP on one batch, flat per layer like `params`."""
    ls = _layers(params, widths)
    hs = [x]
    for w, b in ls[:-1]:
        hs.append(np.maximum(hs[-1] @ w + b, 0))
    z = hs[-1] @ ls[-1][0] + ls[-1][1]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    d = p / len(y)
    out = []
    for i in reversed(range(len(ls))):
        out.append(np.concatenate([(hs[i].T @ d).ravel(), d.sum(0)]).astype(np.float32))
        if i:
            d = (d @ ls[i][0].T) * (hs[i] > 0)
    return out[::-1]


def mlp_accuracy(params, widths, x, y) -> float:
    h = x
    ls = _layers(params, widths)
    for w, b in ls[:-1]:
        h = np.maximum(h @ w + b, 0)
    return float(((h @ ls[-1][0] + ls[-1][1]).argmax(1) == y).mean() * 100)


def _train(rank, n, cfg, agent, dist, barrier, widths, steps, every, batch, lr):
    """Data-parallel SGD on digits through the fabric: every worker the same initial weights,
    its own shard, one all-reduce per layer per step (last layer first, with its position).
    Rank 0 evaluates every `every` steps; the clock stops while it does. Returns the curve
    [(step, training seconds, test accuracy)], the losses, and a crc of the final weights."""
    import torch
    xtr, ytr, xte, yte = digits()
    xs, ys = xtr[rank::n], ytr[rank::n]
    params = mlp_init(widths, 20261201)
    rng = np.random.default_rng([rank, 7])
    nl = len(params)
    curve, lost, partial, elapsed = [], 0, 0, 0.0
    barrier.wait()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        idx = rng.choice(len(ys), batch, replace=False)
        grads = mlp_grad(params, widths, xs[idx], ys[idx])
        for i in reversed(range(nl)):
            if cfg.method == "spina":
                g = agent.allreduce(grads[i], layer=(i, nl))
                lost += agent.last_stats.blocks_lost
                partial += agent.last_stats.partial_rounds
            else:
                t = torch.from_numpy(grads[i])
                dist.all_reduce(t)
                g = grads[i]
            params[i] -= np.float32(lr / n) * g
        elapsed += time.perf_counter() - t0
        if step % every == 0 or step == steps:
            barrier.wait()  # every worker's clock stops here; rank 0 evaluates
            if rank == 0:
                curve.append((step, elapsed, mlp_accuracy(params, widths, xte, yte)))
            barrier.wait()
    crc = 0
    for p in params:
        crc = zlib.crc32(p.view(np.uint8), crc)
    return dict(curve=curve, blocks_lost=lost, partial_rounds=partial, crc=crc,
                seconds=elapsed)


TRAIN_COLUMNS = ("config", "step", "seconds", "test_accuracy")
TRAIN_SUMMARY = ("config", "steps", "seconds", "final_accuracy", "target_accuracy",
                 "seconds_to_target", "steps_to_target", "blocks_lost", "partial_rounds",
                 "congestion_drops", "weights_identical", "load_min", "load_max")


# ----------------------------------------------------------------------------- the run
def pctl(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, linear interpolation (numpy's default)."""
    return float(np.quantile(np.asarray(xs, float), q))


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
                                     args=(child, fab.core)))
            procs[-1].start()
            switch_addr = recv(sw_conn, "aggregator", 60)
            leaf_conn, child = ctx.Pipe()
            procs.append(ctx.Process(target=leaf_main, name="dlcp-leaf",
                                     args=(child, fab.leaf, fab.ports(), fab.l2_entries(),
                                           uplink_spec(a), a.qdepth)))
            procs[-1].start()
            recv(leaf_conn, "leaf", 60)
            barrier = ctx.Barrier(n)
            gloo_port = GLOO_PORT
            for r in range(n):
                parent, child = ctx.Pipe()
                procs.append(ctx.Process(target=worker_main, name=f"dlcp-worker{r}",
                                         args=(r, fab.worker_ns(r), n, sizes, gloo_port, child,
                                               barrier)))
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
                                     args=(child, fab.bg, a.background, a.bg_size)))
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


def uplink_text(a) -> str:
    if a.uplink == "shaper":
        return (f"a port shaper of {a.port_rate} (one rate for the port, strict priority "
                "between its queues, link time taken after egress; 64-frame tail drop per "
                "priority queue)")
    return (f"BMv2's model: each priority queue drained at {a.queue_rate:g} frames/s on its own "
            "(64-frame tail drop)")


def call_blocks(sizes: list[int]) -> list[int]:
    """Blocks of 256 of each call of a step, in call order (last layer first)."""
    return [-(-s // 256) for s in reversed(sizes)]


def step_row(rep, k, cfg, recs, c0, c1, load, sizes) -> dict:
    """One step's CSV row; raises BenchError when a result is wrong: SpINA's results differ
    between ranks, or an exact mode's result is off the exact sum. Whether the blocks lost
    fit the bound is recorded (`within_bound`): per call, the blocks of the result missing a
    contribution (rank 0's comparison with the exact sum) and each rank's `blocks_lost` at
    most floor(bound x the call's blocks), the agents' flush budget."""
    spina = cfg.method == "spina"
    if spina and len({w["crc"] for w in recs}) != 1:
        raise BenchError(f"step {rep} {cfg.name}: SpINA results differ between ranks "
                         f"(crc32 {[w['crc'] for w in recs]})")
    wrong = recs[0]["wrong"]
    if cfg.bounded_loss == 0 and any(wrong):
        raise BenchError(f"step {rep} {cfg.name}: {sum(wrong)} blocks off the exact sum in a "
                         "mode that must be exact")
    allowed = [int(np.floor(cfg.bounded_loss * nb + 1e-9)) for nb in call_blocks(sizes)]
    within = all(wr <= al for wr, al in zip(wrong, allowed))
    if spina:
        within = within and all(lost <= al for w in recs
                                for lost, al in zip(w["calls_lost"], allowed))
    lost_calls = [sum(c) for c in zip(*[w["calls_lost"] for w in recs])] if spina else []
    times = [w["time"] for w in recs]
    return dict(repeat=rep, order=k, config=cfg.name, step_s=max(times),
                worker_max_s=max(times), worker_min_s=min(times), blocks=recs[0]["blocks"],
                blocks_lost=sum(lost_calls), blocks_lost_max_call=max(lost_calls, default=0),
                wrong_blocks=sum(wrong), wrong_blocks_max_call=max(wrong, default=0),
                allowed=" ".join(map(str, allowed)), within_bound=within,
                partial_rounds=recs[0]["partial_rounds"],
                loss_tolerant_packets=sum(w["loss_tolerant_packets"] for w in recs),
                resends=sum(w["resends"] for w in recs),
                timeout_resends=sum(w["timeout_resends"] for w in recs),
                # the flush deadline at the end of each call, mean over calls and ranks
                loss_deadline_ms=round(1e3 * statistics.fmean(
                    d for w in recs for d in w["deadlines"]), 2) if spina else 0.0,
                congestion_drops=c1[0] - c0[0], congestion_seen=c1[1] - c0[1],
                tail_drops=c1[2] - c0[2], load1=round(load, 2),
                crcs=" ".join(f"{w['crc']:08x}" for w in recs) if spina else "")


def summarize(rows: list[dict], a, sizes: list[int]) -> list[dict]:
    """One row per configuration: the step-time distribution and the losses."""
    out = []
    ncalls = len(sizes)
    by = {c.name: c for c in CONFIGS}
    for name in [c.name for c in CONFIGS if c.name in a.configs]:
        rs = [r for r in rows if r["config"] == name]
        if not rs:
            continue
        cfg = by[name]
        t = [r["step_s"] for r in rs]
        med, p99 = statistics.median(t), pctl(t, 0.99)
        per = lambda k: statistics.fmean(r[k] for r in rs)  # noqa: E731 (per step)
        out.append(dict(
            config=name, method=cfg.method, bounded_loss=cfg.bounded_loss,
            priority_policy=(cfg.priority_policy + (f" (priority {cfg.priority})"
                                                    if cfg.priority else "")
                             if cfg.method == "spina" else ""),
            loss_tolerant_policy=cfg.loss_tolerant_policy if cfg.method == "spina" else "",
            workers=a.workers, elements=sum(sizes), layers=ncalls, steps=len(rs),
            median_s=med, p90_s=pctl(t, 0.9), p99_s=p99, min_s=min(t), max_s=max(t),
            spread_p99_over_median=p99 / med, p99_vs_exact_fixed=None,
            blocks_per_step=rs[0]["blocks"], blocks_lost_per_call=per("blocks_lost") / ncalls,
            blocks_lost_max_per_call=max(r["blocks_lost_max_call"] for r in rs),
            wrong_blocks_per_call=per("wrong_blocks") / ncalls,
            wrong_blocks_max_per_call=max(r["wrong_blocks_max_call"] for r in rs),
            bound_blocks_per_call=rs[0]["allowed"],
            partial_rounds_per_step=per("partial_rounds"),
            loss_tolerant_packets_per_step=per("loss_tolerant_packets"),
            resends_per_step=per("resends"), congestion_drops_per_step=per("congestion_drops"),
            loss_deadline_ms=per("loss_deadline_ms"),
            tail_drops_per_step=per("tail_drops"), load_min=min(r["load1"] for r in rs),
            load_max=max(r["load1"] for r in rs),
            within_bound=all(r["within_bound"] for r in rs), verified=True))
    ref = next((r for r in out if r["config"] == "exact/fixed"), None)
    for r in out:
        r["p99_vs_exact_fixed"] = r["p99_s"] / ref["p99_s"] if ref else ""
    return out


# ----------------------------------------------------------------------------- outputs
def write_csv(rows, columns, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def target_lines(rows) -> list[str]:
    """Issue 14's step-time target, per priority policy: met or not met."""
    by = {r["config"]: r for r in rows}
    out = []
    for pol, dl in (("fixed", ""), ("layer", ""), ("fixed", "/auto"), ("layer", "/auto")):
        b, e = by.get(f"b10%/{pol}{dl}"), by.get(f"exact/{pol}")
        if b is None or e is None:
            continue
        ratio = b["p99_s"] / e["p99_s"]
        out.append(f"- priority {pol}, loss deadline {'auto' if dl else 'fixed'}: p99 step "
                   f"time with a 10% bound {b['p99_s']:.3f} s vs "
                   f"exact {e['p99_s']:.3f} s = **{ratio:.2f}x** (target <= {TARGET}x): "
                   f"**{'met' if ratio <= TARGET else 'NOT met'}**")
    return out


PAIRS = tuple((f"b{b}/{pol}{dl}", ref) for pol in ("fixed", "layer") for b in ("1%", "10%")
              for dl, ref in (("", f"exact/{pol}"), ("/auto", f"exact/{pol}"),
                              ("/auto", f"b{b}/{pol}")))


def paired_lines(step_rows) -> list[str]:
    """Step times compared repeat by repeat: each repeat runs every configuration once within
    seconds, so the ratio of two configurations' steps in one repeat sees the same load (the
    p99 of 50 steps is their second slowest and follows the machine's worst moments)."""
    by: dict[str, dict[int, float]] = {}
    for r in step_rows:
        by.setdefault(r["config"], {})[int(r["repeat"])] = float(r["step_s"])
    out = []
    for a, b in PAIRS:
        reps = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        if not reps:
            continue
        ratio = [by[a][k] / by[b][k] for k in reps]
        out.append(f"- {a} / {b}: median ratio {statistics.median(ratio):.3f} "
                   f"(p90 {pctl(ratio, 0.9):.3f}), faster in {sum(x < 1 for x in ratio)} of "
                   f"{len(reps)} repeats")
    return out


def table(rows) -> list[str]:
    lines = ["| configuration | median s | p90 s | p99 s | min-max s | p99/median | "
             "p99 / exact-fixed p99 | blocks lost per call (all ranks) | result blocks off "
             "the exact sum per call (max) | bound, blocks per call (call order) | "
             "within bound | partial rounds per step | loss-tolerant packets per step | "
             "resends per step | loss deadline ms (mean) | congestion drops per step | "
             "tail drops per step | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spina = r["method"] == "spina"
        na = "n/a"
        lines.append(
            f"| {r['config']} | {r['median_s']:.3f} | {r['p90_s']:.3f} | **{r['p99_s']:.3f}** | "
            f"{r['min_s']:.3f}-{r['max_s']:.3f} | {r['spread_p99_over_median']:.2f} | "
            f"{r['p99_vs_exact_fixed']:.2f} | "
            + (f"{r['blocks_lost_per_call']:.2f} | {r['wrong_blocks_per_call']:.2f} "
               f"({r['wrong_blocks_max_per_call']}) | {r['bound_blocks_per_call']} | "
               f"{'yes' if r['within_bound'] else '**NO**'} | "
               f"{r['partial_rounds_per_step']:.1f} | {r['loss_tolerant_packets_per_step']:.1f} | "
               f"{r['resends_per_step']:.1f} | "
               + (f"{r['loss_deadline_ms']:.1f}" if r["bounded_loss"] else na)
               + f" | {r['congestion_drops_per_step']:.1f} | "
               if spina else f"{na} | {na} | {na} | {na} | {na} | {na} | {na} | {na} | {na} | ")
            + f"{r['tail_drops_per_step']:.1f} | {r['load_min']:.1f}-{r['load_max']:.1f} |")
    return lines


def summary(rows, meta: dict, step_rows=()) -> str:
    lines = ["# DLCP: step time under congestion", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "## Target (issue 14)", ""] + (target_lines(rows) or ["- (not run)"])
    lines += ["", "## Results", ""] + table(rows)
    lines += ["", "## Paired by repeat (same load)", ""] + (paired_lines(step_rows) or ["- (none)"])
    return "\n".join(lines) + "\n"


def plot(step_rows, rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["config"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    data = [[s["step_s"] for s in step_rows if s["config"] == nm] for nm in names]
    ax1.boxplot(data, whis=(0, 100), showfliers=False)
    for i, d in enumerate(data, 1):
        ax1.plot(np.full(len(d), i) + np.linspace(-0.15, 0.15, len(d)), d, ".", ms=3,
                 color="C0", alpha=0.6)
        ax1.plot([i], [pctl(d, 0.99)], marker="v", color="C3", ms=8)
    ax1.set_xticks(range(1, len(names) + 1), names, rotation=30, fontsize=8)
    ax1.set_ylabel("step time, s (slowest worker)")
    ax1.set_title("step time per configuration (box: quartiles, whiskers min-max, "
                  "red: p99)", fontsize=9)
    ax1.grid(True, axis="y", alpha=0.3)
    for i, nm in enumerate(names):
        xs = sorted(s["step_s"] for s in step_rows if s["config"] == nm)
        ls = {(True, True): "-.", (True, False): "--", (False, True): ":"}.get(
            ("layer" in nm, nm.endswith("/auto")), "-")
        ax2.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=nm, ls=ls,
                 color="k" if nm == "gloo" else plt.cm.tab20(i % 20))
    ax2.set_xscale("log")
    ax2.set_xlabel("step time, s")
    ax2.set_ylabel("fraction of steps")
    ax2.set_title("step-time distribution (CDF)", fontsize=9)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def _widths(text: str) -> list[int]:
    try:
        w = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated layer widths, "
                                         "e.g. 64,64,10") from None
    if len(w) < 2 or min(w) < 1 or sum(layer_sizes(w)) > 50_000_000:
        raise argparse.ArgumentTypeError(f"{text!r}: need at least two widths >= 1 and at most "
                                         "50M parameters")
    return w


def _rate(text: str) -> str:
    try:
        parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _port_rate(text: str):
    from softswitch.egress import parse_port_rate
    try:
        return parse_port_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(kind, lo, hi):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} outside {lo}..{hi}")
        return v
    parse.__name__ = kind.__name__
    return parse


def _configs(text: str) -> list[str]:
    names = [c.name for c in CONFIGS]
    got = text.split(",")
    bad = [g for g in got if g not in names]
    if bad:
        raise argparse.ArgumentTypeError(f"{','.join(bad)}: not a configuration (choose from "
                                         f"{', '.join(names)})")
    return got


def parse_args(argv=None):
    from spina import cli
    ap = cli.ArgumentParser(prog="python -m bench.dlcp_bench",
                            description=__doc__.split("\n\n")[0],
                            epilog="Needs root (network namespaces, veth, tc, raw sockets). "
                                   "Module docstring: the fabric and what is measured.")
    ap.add_argument("--workers", type=_positive(int, 2, 16), default=4,
                    help="workers (2..16, default %(default)s)")
    ap.add_argument("--model", type=_widths, default=[784, 512, 256, 10],
                    help="MLP layer widths whose gradient one step all-reduces, one call per "
                         "layer (default 784,512,256,10: 536K float32, 2.1 MB, 3 calls; "
                         "64,64,10 is the digits MLP)")
    ap.add_argument("--steps", type=_positive(int, 1, 10000), default=50,
                    help="repeats; each runs every configuration once, order rotating "
                         "(default %(default)s, after one warm-up repeat)")
    ap.add_argument("--configs", type=_configs, default=list(DEFAULT_CONFIGS),
                    help="comma list of configurations (default all: "
                         f"{','.join(DEFAULT_CONFIGS)})".replace("%", "%%"))
    ap.add_argument("--rate", type=_rate, default="1gbit",
                    help="tbf rate of every worker link, both ways (default %(default)s)")
    ap.add_argument("--uplink", choices=("shaper", "bmv2"), default="shaper",
                    help="the leaf uplink's model: shaper = a port shaper (one link rate "
                         "--port-rate, strict priority between the queues, a congestion-dropped "
                         "frame takes no link time: a real port's model); bmv2 = BMv2's traffic "
                         "manager (each priority queue drained at --queue-rate on its own, the "
                         "drop decided after the frame's departure slot; the model of the first "
                         "run in docs/dlcp.md). Default %(default)s")
    ap.add_argument("--port-rate", type=_port_rate, default="400mbit",
                    help="--uplink shaper: the uplink's rate, bits/s (400mbit), frames/s "
                         "(8000pps) or both (default %(default)s)")
    ap.add_argument("--queue-rate", type=_positive(float, 100, 1e6), default=8000,
                    help="--uplink bmv2: frames a second each priority queue of the leaf's "
                         "uplink drains (default %(default)s)")
    ap.add_argument("--background", type=_positive(float, 0, 1e6), default=4000,
                    help="background frames a second through the uplink, open loop "
                         "(priority 0; default %(default)s)")
    ap.add_argument("--bg-size", type=_positive(int, 64, 8900), default=6000,
                    help="background UDP payload bytes (default %(default)s: with the default "
                         "rates 4000 x 6042 B = 194 Mbit/s on the wire, half the uplink; the first "
                         "run, --uplink bmv2, used 1000)")
    ap.add_argument("--qdepth", type=_positive(int, 0, 1000), default=16,
                    help="the congestion entry's threshold: frames queued at the uplink above "
                         "which a loss-tolerant contribution may be dropped (default "
                         "%(default)s)")
    ap.add_argument("--loss-deadline", type=cli.seconds_or_auto, default=0.03,
                    metavar="SECONDS|auto",
                    help="seconds a round may wait before the agents flush it PARTIAL "
                         "(bounded modes without /auto in their name; default %(default)s), or "
                         "'auto': twice the measured round latency, 2-50 ms")
    ap.add_argument("--nslots", type=_positive(int, 1, 64), default=16,
                    help="SpINA slots per job (the window; default %(default)s)")
    ap.add_argument("--train", type=_positive(int, 0, 100000), default=0, metavar="STEPS",
                    help="instead of the step-time experiment: train --train-model on "
                         "scikit-learn's digits for STEPS steps per configuration through the "
                         "same congested fabric (configurations one after another), and report "
                         "the time to --target-accuracy (default 0: off)")
    ap.add_argument("--train-model", type=_widths, default=[64, 1024, 512, 10],
                    help="--train: MLP widths, 64 inputs and 10 outputs (default "
                         "64,1024,512,10: 596K float32, about the step-time gradient's size)")
    ap.add_argument("--eval-every", type=_positive(int, 1, 100000), default=10,
                    help="--train: steps between test-accuracy evaluations (default "
                         "%(default)s; the clock stops while rank 0 evaluates)")
    ap.add_argument("--lr", type=_positive(float, 1e-6, 10), default=0.1,
                    help="--train: SGD learning rate, batch 32 per worker (default %(default)s)")
    ap.add_argument("--target-accuracy", type=_positive(float, 1, 100), default=97.0,
                    help="--train: test accuracy (%%) whose first reaching is the time to "
                         "accuracy (default %(default)s)")
    ap.add_argument("--tag", default=f"dlb{os.getpid() % 100000}",
                    help="prefix of the namespaces this run makes")
    ap.add_argument("--out", default="bench/out/dlcp", help="output directory")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every step")
    return ap.parse_args(argv)


def train_outputs(train: list[dict], a) -> tuple[list[dict], list[dict]]:
    """Rows of the curves and one summary row per configuration; raises BenchError when a
    SpINA run's ranks ended with different weights."""
    curves, rows = [], []
    for t in train:
        recs, curve = t["recs"], t["recs"][0]["curve"]
        same = len({r["crc"] for r in recs}) == 1
        if not same and t["config"] != "gloo":
            raise BenchError(f"training {t['config']}: the workers' weights differ")
        curves += [dict(config=t["config"], step=st, seconds=sec, test_accuracy=acc)
                   for st, sec, acc in curve]
        hit = next(((st, sec) for st, sec, acc in curve if acc >= a.target_accuracy), None)
        rows.append(dict(config=t["config"], steps=curve[-1][0], seconds=curve[-1][1],
                         final_accuracy=curve[-1][2], target_accuracy=a.target_accuracy,
                         seconds_to_target=hit[1] if hit else "",
                         steps_to_target=hit[0] if hit else "",
                         blocks_lost=sum(r["blocks_lost"] for r in recs),
                         partial_rounds=recs[0]["partial_rounds"],
                         congestion_drops=t["drops"], weights_identical=same,
                         load_min=min(t["load"]), load_max=max(t["load"])))
    return curves, rows


def train_plot(curves, rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in rows:
        c = [x for x in curves if x["config"] == r["config"]]
        ax.plot([x["seconds"] for x in c], [x["test_accuracy"] for x in c], label=r["config"],
                ls="--" if r["config"].endswith("layer") else "-",
                color="k" if r["config"] == "gloo" else None)
    if rows:
        ax.axhline(rows[0]["target_accuracy"], color="grey", lw=0.8)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("test accuracy, %")
    ax.set_ylim(80, 100)
    ax.set_title("digits through the congested uplink: accuracy vs time", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_train(a, argv) -> int:
    """--train: time to accuracy per configuration."""
    w = a.train_model
    if w[0] != 64 or w[-1] != 10:
        print("python -m bench.dlcp_bench: error: argument --train-model: digits need 64 "
              f"inputs and 10 outputs, got {','.join(map(str, w))}", file=sys.stderr)
        return 2
    load0, t0 = os.getloadavg(), time.time()
    print(f"training {','.join(map(str, w))} on digits, {a.train} steps per configuration, "
          f"{a.workers} workers; uplink {uplink_text(a)}, background {a.background:g} "
          f"frames/s of {a.bg_size} B", flush=True)
    try:
        train, _, info = run(a)
        curves, rows = train_outputs(train, a)
    except BenchError as e:
        print(f"python -m bench.dlcp_bench: error: {e}", file=sys.stderr)
        return 1
    write_csv(curves, TRAIN_COLUMNS, os.path.join(a.out, "dlcp_train_curves.csv"))
    write_csv(rows, TRAIN_SUMMARY, os.path.join(a.out, "dlcp_train.csv"))
    if not a.no_plots:
        train_plot(curves, rows, os.path.join(a.out, "dlcp_train.png"))
    args = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m bench.dlcp_bench {args}; "
          f"took {time.time() - t0:.0f} s; load {load0[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; background sent {info['bg_sent']}")
    for r in rows:
        print(f"  {r['config']:>15}: final {r['final_accuracy']:.2f}% after {r['seconds']:.1f} s; "
              f"{a.target_accuracy:g}% at "
              + (f"{r['seconds_to_target']:.1f} s (step {r['steps_to_target']})"
                 if r["seconds_to_target"] != "" else "never")
              + f"; blocks lost {r['blocks_lost']}, partial rounds {r['partial_rounds']}, "
                f"congestion drops {r['congestion_drops']}, load {r['load_min']:.1f}-"
                f"{r['load_max']:.1f}")
    print(f"wrote {a.out}/dlcp_train.csv, dlcp_train_curves.csv"
          + ("" if a.no_plots else ", dlcp_train.png"))
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("python -m bench.dlcp_bench: error: needs root (network namespaces, veth, tc, "
              "raw sockets)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    if a.train:
        return main_train(a, argv)
    load0 = os.getloadavg()
    t0 = time.time()
    sizes = layer_sizes(a.model)
    print(f"{a.workers} workers, model {','.join(map(str, a.model))} ({sum(sizes)} float32, "
          f"{len(sizes)} calls per step), {a.steps} repeats of {len(a.configs)} "
          f"configurations; uplink {uplink_text(a)}, background "
          f"{a.background:g} frames/s", flush=True)
    try:
        step_rows, rows, info = run(a)
    except BenchError as e:
        print(f"python -m bench.dlcp_bench: error: {e}", file=sys.stderr)
        return 1
    write_csv(step_rows, STEP_COLUMNS + ("blocks_lost_max_call", "wrong_blocks_max_call",
                                         "allowed", "within_bound", "crcs"),
              os.path.join(a.out, "dlcp_steps.csv"))
    write_csv(rows, COLUMNS, os.path.join(a.out, "dlcp_congestion.csv"))
    tbf = tbf_params(a.rate, MTU)
    meta = {
        "command": "python -m bench.dlcp_bench " + " ".join(argv if argv is not None
                                                           else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                + f"; took {time.time() - t0:.0f} s; host {platform.node()}: {os.cpu_count()} "
                  f"cores, Python {platform.python_version()}",
        "load average": f"{' '.join(f'{x:.2f}' for x in load0)} at the start, "
                        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end (per "
                        "configuration in the table)",
        "fabric": f"{a.workers} worker namespaces + a background sender on an L2-mode software "
                  f"switch (leaf) whose uplink to the core (router + UDP-mode aggregator) is "
                  f"{uplink_text(a)}; "
                  f"worker links tbf {a.rate} both ways (burst {tbf['burst']} B, "
                  f"{tbf['latency_ms']} ms), MTU {MTU}",
        "background": f"{a.background:g} UDP frames/s of {a.bg_size} B, open loop, priority 0 "
                      f"({info['bg_sent']} sent)",
        "gradient": f"MLP {','.join(map(str, a.model))}: {sum(sizes)} float32 "
                    f"({4 * sum(sizes) / 1e6:.1f} MB) per worker, {len(sizes)} calls per step "
                    "(last layer first, each with its layer position)",
        "SpINA": f"block 256, {NLANES} blocks per datagram, {a.nslots} slots, loss deadline "
                 f"{a.loss_deadline} s (configurations /auto: from the round latency); "
                 f"congestion threshold {a.qdepth} frames",
        "timing": f"{a.steps} repeats after a warm-up, each running every configuration once, "
                  "order rotating; a step's time is the slowest worker's",
    }
    with open(os.path.join(a.out, "dlcp_summary.md"), "w") as f:
        f.write(summary(rows, meta, step_rows))
    if not a.no_plots:
        plot(step_rows, rows, os.path.join(a.out, "dlcp_congestion.png"))
    for line in table(rows) + [""] + target_lines(rows) + [""] + paired_lines(step_rows):
        print(line)
    print(f"wrote {a.out}/dlcp_steps.csv, dlcp_congestion.csv, dlcp_summary.md"
          + ("" if a.no_plots else ", dlcp_congestion.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
