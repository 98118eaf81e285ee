"""Start a SpINA mininet testbed and run one all-reduce on every host (or open the CLI).

    python -m testbed single --hosts 4
    python -m testbed leafspine --leaves 2 --spines 2 --hosts-per-leaf 2 --cli
    python -m testbed leafspine --two-level --hosts-per-leaf 4 --loss 0.01 --density 0.01
    python -m testbed leafspine --spine-bytes --hosts-per-leaf 4   # flat vs two-level bytes
    python -m testbed single --switch bmv2        # needs `make p4` and simple_switch_grpc

Needs root. Every process and link it starts is removed on exit.
"""
from __future__ import annotations

import json
import pathlib
import sys

from spina import cli, wire
from testbed import topos

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_allreduce(tb: topos.Testbed, jd: dict, seed: int = 1, n: int = 20000,
                  density: float = 0.3, calls: str = "both") -> list[dict]:
    """Every host runs tests/netns_worker.py (against its own switch: the aggregating one, or
    in two-level mode its leaf); returns their JSON reports. `calls`: "both" (an int32 and a
    float32 all-reduce) or "ints"."""
    procs = []
    for i, h in enumerate(tb.hosts):
        job, (addr, port) = tb.switch_of(i, jd)
        procs.append(h.popen([sys.executable, str(ROOT / "tests" / "netns_worker.py"),
                              json.dumps(job), str(i), addr, str(port), str(seed), str(n),
                              str(density), calls], cwd=str(ROOT)))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"worker failed: {stderr.decode()[-2000:]}")
            out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def first_transmission_bytes(senders: int, n: int, jd: dict) -> int:
    """The bytes one dense int32 all-reduce of `n` elements puts on the spine links when
    `senders` streams cross them and nothing is resent: flat, every worker's contributions go
    up and one result copy per worker comes down; two-level, one partial per rack and round
    goes up and one result per rack comes down. Each stream is, per call, one setup round per
    slot (header and next positions only) and n / (nlanes * block_size) rounds of full
    frames (Ethernet, IPv4, UDP, the INA packet with every lane present), the same sizes up
    and down. `n` must be a multiple of nlanes * block_size (every round full)."""
    from spina import wire
    nlanes, block, nslots = jd["nlanes"], jd["block_size"], jd["nslots"]
    if n % (nlanes * block):
        raise ValueError(f"{n} elements: not a multiple of nlanes * block_size = "
                         f"{nlanes * block}")
    frame = 14 + 20 + 8  # Ethernet, IPv4, UDP headers
    stream = (n // (nlanes * block) * (frame + wire.packet_len(nlanes, block, nlanes))
              + nslots * (frame + wire.packet_len(nlanes, block, 0)))
    return 2 * senders * stream


def spine_link_bytes(leaves: int, spines: int, hosts_per_leaf: int, two_level: bool,
                     switch: str = "soft", seed: int = 1, n: int = 32768) -> tuple[int, list]:
    """One dense int32 all-reduce on a fresh leafspine testbed, flat or two-level: (bytes
    sent and received on the spines' interfaces during it, the workers' reports)."""
    tb = topos.leafspine(leaves, spines, hosts_per_leaf, two_level=two_level, switch=switch)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        before = topos.link_bytes(tb.spine_links())
        reports = run_allreduce(tb, jd, seed=seed, n=n, density=1.0, calls="ints")
        return topos.link_bytes(tb.spine_links()) - before, reports
    finally:
        tb.stop()


def main(argv=None) -> int:
    p = cli.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n\n")[0])
    p.add_argument("topology", choices=["single", "leafspine"])
    p.add_argument("--switch", choices=["soft", "bmv2"], default="soft",
                   help="switch nodes: the software switch in L2 mode (default) or BMv2")
    # one job of every host: at most wire.MAX_WORKERS; addresses: hosts .1.., leaves .201..,
    # spines .241.. of 10.0.0.0/24
    p.add_argument("--hosts", type=cli.int_range(1, wire.MAX_WORKERS), default=3,
                   help="single: number of hosts")
    p.add_argument("--leaves", type=cli.int_range(1, wire.MAX_WORKERS), default=2)
    p.add_argument("--spines", type=cli.int_range(1, 14), default=2)
    p.add_argument("--hosts-per-leaf", type=cli.int_range(1, wire.MAX_WORKERS), default=2)
    p.add_argument("--two-level", action="store_true",
                   help="leafspine: each leaf aggregates its hosts, the job's slots sharded over "
                        "the spines; every switch programmed by the controller's deploy over "
                        "P4Runtime (the desired state is printed)")
    p.add_argument("--loss", type=float, default=0.0, metavar="P",
                   help="drop this fraction of the frames on every link, each direction")
    p.add_argument("--density", type=float, default=0.3,
                   help="fraction of non-zero blocks in each worker's tensors")
    p.add_argument("--elements", type=int,
                   help="elements per tensor (default 20000; --spine-bytes: 32768)")
    p.add_argument("--spine-bytes", action="store_true",
                   help="leafspine: run one dense int32 call flat and one two-level, print the "
                        "bytes on the spine links of each")
    p.add_argument("--cli", action="store_true", help="open the mininet CLI instead")
    a = p.parse_args(argv)
    if not 0.0 <= a.loss < 1.0:
        p.error("argument --loss: must be a fraction in [0, 1)")
    if not 0.0 < a.density <= 1.0:
        p.error("argument --density: must be a fraction in (0, 1]")
    if a.elements is None:
        a.elements = 32768 if a.spine_bytes else 20000
    if a.elements < 1:
        p.error("argument --elements: must be at least 1")
    if a.topology != "leafspine" and (a.two_level or a.spine_bytes):
        p.error("argument --two-level/--spine-bytes: only for the leafspine topology")
    hosts = a.leaves * a.hosts_per_leaf
    if a.topology == "leafspine" and a.two_level and hosts > topos.MAX_HOSTS:
        # Two levels: 32 racks x 32 workers per job; the hosts' addresses stop below the
        # flat endpoint's 10.0.0.100.
        p.error(f"argument --leaves/--hosts-per-leaf: {hosts} hosts, the testbed addresses at "
                f"most {topos.MAX_HOSTS}")
    if a.topology == "leafspine" and not a.two_level and hosts > wire.MAX_WORKERS:
        p.error(f"argument --leaves/--hosts-per-leaf: {hosts} hosts, a flat job has at most "
                f"{wire.MAX_WORKERS} workers (--two-level: up to {topos.MAX_HOSTS})")
    if (a.two_level or a.spine_bytes) and a.spines > topos.JOB_SIZES["nslots"]:
        p.error(f"argument --spines: the job's {topos.JOB_SIZES['nslots']} slots are sharded "
                f"over the spines, so at most {topos.JOB_SIZES['nslots']} spines")
    if a.spine_bytes:
        jd = topos.JOB_SIZES
        if a.elements % (jd["nlanes"] * jd["block_size"]):
            p.error(f"argument --elements: --spine-bytes needs a multiple of nlanes * "
                    f"block_size = {jd['nlanes'] * jd['block_size']}")
        out = {}
        for mode, senders in (("flat", a.leaves * a.hosts_per_leaf), ("two_level", a.leaves)):
            got, reports = spine_link_bytes(a.leaves, a.spines, a.hosts_per_leaf,
                                            mode == "two_level", a.switch, n=a.elements)
            out[mode] = {"spine_link_bytes": got,
                         "without_resends": first_transmission_bytes(senders, a.elements, jd),
                         "worker_resends": sum(r["calls"][0]["resends"] for r in reports)}
        out["ratio"] = out["two_level"]["spine_link_bytes"] / out["flat"]["spine_link_bytes"]
        out["target"] = 1 / a.hosts_per_leaf
        print(json.dumps(out))
        return 0
    if a.topology == "single":
        tb = topos.single(a.hosts, switch=a.switch)
    else:
        tb = topos.leafspine(a.leaves, a.spines, a.hosts_per_leaf, two_level=a.two_level,
                             switch=a.switch)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        if a.two_level:
            print(tb.state_path.read_text())
        if a.loss:
            tb.drop_randomly(a.loss)
        if a.cli:
            from mininet.cli import CLI
            CLI(tb.net)
        else:
            for r in run_allreduce(tb, jd, n=a.elements, density=a.density):
                print(json.dumps(r))
    finally:
        tb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
