"""Start a SpINA mininet testbed and run one all-reduce on every host (or open the CLI).

    python -m testbed single --hosts 4
    python -m testbed leafspine --leaves 2 --spines 2 --hosts-per-leaf 2 --cli
    python -m testbed leafspine --two-level --hosts-per-leaf 4 --loss 0.01 --density 0.01
    python -m testbed leafspine --spine-bytes --hosts-per-leaf 4   # flat vs two-level bytes
    python -m testbed leafspine --spray --cli     # frames to remote hosts sprayed per packet
    python -m testbed leafspine --spray-traffic --tcp-seconds 5   # spine links, with/without
    python -m testbed single --switch bmv2        # needs `make p4` and simple_switch_grpc

Needs root. Every process and link it starts is removed on exit.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

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
        procs.append(h.popen([sys.executable, "-m", "tests.netns_worker",
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


_UDP_RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
s.settimeout(10.0)
got = late = top = 0
try:
    while True:
        seq = int(s.recv(65536)[:8])
        s.settimeout(2.0)
        got += 1
        late += seq < top  # overtaken by a later datagram: reordered
        top = max(top, seq)
except socket.timeout:
    pass
print(got, late)
"""
_UDP_SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n, size = int(sys.argv[3]), int(sys.argv[4])
for i in range(n):
    s.sendto(b"%08d" % i + bytes(size - 8), (sys.argv[1], int(sys.argv[2])))
    if i % 5 == 4:
        time.sleep(0.001)  # paced: the software switch keeps up, nothing is queued away
"""


def spine_link_counters(tb: topos.Testbed) -> dict[str, tuple[int, int]]:
    """Per leaf-spine link ("lf1-sp2"): (frames, bytes) both ways so far, from the kernel
    counters of the spine's interface on it (leaf i on spine port i + 1)."""
    out = {}
    for j, sp in enumerate(tb.spines):
        for port, intf in sp.intfs.items():
            if intf.name == "lo" or port < 1:
                continue
            stats = pathlib.Path(f"/sys/class/net/{intf.name}/statistics")
            n = {k: int((stats / k).read_text())
                 for k in ("tx_packets", "rx_packets", "tx_bytes", "rx_bytes")}
            out[f"lf{port}-sp{j + 1}"] = (n["tx_packets"] + n["rx_packets"],
                                          n["tx_bytes"] + n["rx_bytes"])
    return out


def spray_traffic(spray: bool, spines: int = 2, hosts_per_leaf: int = 1, switch: str = "soft",
                  datagrams: int = 2000, size: int = 1000, tcp_seconds: float = 0.0) -> dict:
    """Non-INA traffic across the spines of a 2-leaf flat testbed, with or without per-packet
    spraying: `datagrams` paced UDP datagrams of `size` payload bytes from the first host of
    rack 0 to the last host of rack 1, then (tcp_seconds > 0) one iperf TCP stream the same
    way. Returns each leaf-spine link's (frames, bytes) during the UDP run, the datagrams
    received and how many arrived after a later one, and the TCP throughput in Mbit/s."""
    tb = topos.leafspine(2, spines, hosts_per_leaf, spray=spray, switch=switch)
    src, dst = tb.hosts[0], tb.hosts[-1]
    out = {"spray": spray, "datagrams": datagrams, "frame_bytes": 14 + 20 + 8 + size}
    try:
        tb.start()
        recv = dst.popen([sys.executable, "-c", _UDP_RECEIVER, dst.IP(), "40001"])
        try:
            recv.stdout.readline()  # "ready"
            before = spine_link_counters(tb)
            sender = src.popen([sys.executable, "-c", _UDP_SENDER, dst.IP(), "40001",
                                str(datagrams), str(size)])
            if sender.wait(timeout=60) != 0:
                raise RuntimeError(f"UDP sender failed: {sender.stderr.read().decode()}")
            got, late = (int(x) for x in recv.communicate(timeout=60)[0].split()[-2:])
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
        after = spine_link_counters(tb)
        out["links"] = {k: [after[k][0] - before[k][0], after[k][1] - before[k][1]]
                        for k in sorted(after)}
        out["received"], out["reordered"] = got, late
        if tcp_seconds > 0:
            server = dst.popen(["iperf", "-s", "-p", "5201"])
            try:
                time.sleep(0.5)
                client = src.popen(["iperf", "-c", dst.IP(), "-p", "5201", "-t",
                                    str(tcp_seconds), "-y", "C"])
                csv = client.communicate(timeout=tcp_seconds + 30)[0].decode()
                out["tcp_mbit_s"] = round(int(csv.strip().splitlines()[-1].split(",")[-1])
                                          / 1e6, 2)
            finally:
                server.kill()
                server.wait()
    finally:
        tb.stop()
    return out


def parser(prog: str = "python -m testbed") -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
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
    p.add_argument("--loss", type=cli.unit_interval, default=0.0, metavar="P",
                   help="drop this fraction of the frames on every link, each direction")
    p.add_argument("--density", type=cli.fraction, default=0.3,
                   help="fraction of non-zero blocks in each worker's tensors")
    p.add_argument("--elements", type=cli.int_range(1),
                   help="elements per tensor (default 20000; --spine-bytes: 32768)")
    p.add_argument("--spine-bytes", action="store_true",
                   help="leafspine: run one dense int32 call flat and one two-level, print the "
                        "bytes on the spine links of each")
    p.add_argument("--spray", action="store_true",
                   help="leafspine: leaves spray frames to remote hosts over every spine, per "
                        "packet (reorders TCP; off by default)")
    p.add_argument("--spray-traffic", action="store_true",
                   help="leafspine: send UDP datagrams (and with --tcp-seconds an iperf TCP "
                        "stream) from rack 0 to rack 1 without and with --spray, print each "
                        "leaf-spine link's frames and bytes")
    p.add_argument("--datagrams", type=cli.int_range(1, 10**6), default=2000,
                   help="--spray-traffic: UDP datagrams of 1000 bytes")
    p.add_argument("--tcp-seconds", type=cli.non_negative_float, default=0.0,
                   help="--spray-traffic: also time one iperf TCP stream this long")
    p.add_argument("--cli", action="store_true", help="open the mininet CLI instead")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.topology != "leafspine" and (a.spray or a.spray_traffic):
        p.error("argument --spray/--spray-traffic: only for the leafspine topology")
    if not 0.0 <= a.tcp_seconds <= 600:
        p.error("argument --tcp-seconds: must be in 0..600")
    if a.spray_traffic:
        for spray in (False, True):
            print(json.dumps(spray_traffic(spray, a.spines, a.hosts_per_leaf, a.switch,
                                           a.datagrams, tcp_seconds=a.tcp_seconds)))
        return 0
    if not 0.0 <= a.loss < 1.0:
        p.error("argument --loss: must be a fraction in [0, 1)")
    if a.elements is None:
        a.elements = 32768 if a.spine_bytes else 20000
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
                             spray=a.spray, switch=a.switch)
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
