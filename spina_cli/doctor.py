"""`spina doctor -c spina.yaml`: check a deployment against its desired-state file.

One line per check, `ok`, `warn` or `FAIL`, and exit 1 if any failed:
  - each switch answers P4Runtime and runs the pipeline the file names (same cookie as
    `deploy` computes from the P4Info and device config);
  - each job is admitted on its switch with the file's slot range and epoch (under `serve`
    each run advances the epoch: a newer one on the switch is reported, not failed);
  - each worker's address has a route from here, and each switch's INA address;
  - a job's largest packet (all lanes present) fits the MTU of the route to its switch (P4
    targets; the UDP-mode software switch takes datagrams up to 64 KB, fragmented by IP);
  - this host's clock is compared with each switch's only through the epochs: P4Runtime
    carries no time, so a clock check needs NTP's own tools (`chronyc tracking`).
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys

from controller.controller import Controller, cookie_of, load_pipeline
from controller.p4rt import P4RuntimeError
from controller.state import load
from spina import wire
from spina.config import ConfigError

IP_UDP = 28  # IPv4 + UDP headers


def route_mtu(addr: str) -> tuple[str, int] | None:
    """(interface, MTU) of the route to `addr`, or None if there is no route."""
    try:
        out = subprocess.run(["ip", "-o", "route", "get", addr], capture_output=True, text=True,
                             timeout=10).stdout.split()
        dev = out[out.index("dev") + 1]
        with open(f"/sys/class/net/{dev}/mtu") as f:
            return dev, int(f.read())
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def reachable(ip: str, port: int) -> bool:
    """True if the kernel has a route to (ip, port) (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, port))
            return True
        except OSError:
            return False


def check(config: str, election_id: int = 1, timeout: float = 10.0):
    """Yield (level, message) for every check of the deployment in `config`."""
    state = load(config)
    with Controller(state, election_id, timeout=timeout) as ctl:
        for name, sw in state.switches.items():
            jobs = state.jobs_on(sw)
            s = ctl.session(name)
            try:
                cur = s.conn.get_pipeline()
            except (P4RuntimeError, OSError) as e:
                yield "FAIL", f"switch {name}: no answer at {sw.grpc}: {e}"
                continue
            yield "ok", f"switch {name}: answers P4Runtime at {sw.grpc}"
            info, cfg = load_pipeline(state, sw)
            if cur is None or not cur.p4info.tables:
                yield "FAIL", f"switch {name}: runs no pipeline (run `spina deploy`)"
                continue
            if cur.HasField("cookie") and cur.cookie.cookie == cookie_of(info, cfg):
                yield "ok", f"switch {name}: pipeline matches the P4Info"
            else:
                yield "FAIL", (f"switch {name}: its pipeline differs from the file's P4Info "
                               "(`spina deploy` pushes it)")
            s.attach()
            installed = s.admission.installed_jobs()
            for j in jobs:
                got = installed.get(j.id)
                if got is None:
                    yield "FAIL", f"job {j.id}: not admitted on switch {name} (`spina deploy`)"
                    continue
                base, n, epoch = got
                if (base, n) != (j.slot_base, j.nslots):
                    yield "FAIL", (f"job {j.id}: switch {name} admits slots {base}..{base + n - 1}"
                                   f", the file says {j.slot_base}..{j.slot_base + j.nslots - 1}")
                elif epoch == j.epoch:
                    yield "ok", f"job {j.id}: admitted on {name}, slots and epoch {epoch} agree"
                elif epoch > j.epoch:
                    yield "warn", (f"job {j.id}: switch {name} runs epoch {epoch}, the file says "
                                   f"{j.epoch} (a `serve` run advanced it)")
                else:
                    yield "FAIL", (f"job {j.id}: switch {name} runs epoch {epoch}, older than the "
                                   f"file's {j.epoch}")
                need = IP_UDP + wire.packet_len(j.nlanes, j.block_size, j.nlanes)
                mtu = route_mtu(sw.address)
                if mtu is None:
                    yield "FAIL", f"switch {name}: no route to its INA address {sw.address}"
                elif need <= mtu[1]:
                    yield "ok", f"job {j.id}: {need}-byte packets fit MTU {mtu[1]} ({mtu[0]})"
                elif sw.target == "softswitch":
                    yield "warn", (f"job {j.id}: {need}-byte packets exceed MTU {mtu[1]} "
                                   f"({mtu[0]}): IP fragments them (UDP-mode software switch)")
                else:
                    yield "FAIL", (f"job {j.id}: {need}-byte packets exceed MTU {mtu[1]} "
                                   f"({mtu[0]}): lower nlanes or block_size")
        for w in state.workers.values():
            if reachable(w.ip, w.udp_port):
                yield "ok", f"worker {w.name}: {w.ip}:{w.udp_port} is routable from here"
            else:
                yield "FAIL", f"worker {w.name}: no route to {w.ip}:{w.udp_port}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spina doctor", description=__doc__.split("\n\n", 1)[0]
                                 + ": the switch answers, its pipeline matches the P4Info, every "
                                 "job is admitted with the file's slots and epoch, every worker "
                                 "address is routable, packets fit the MTU. Exit 1 if a check "
                                 "fails.")
    ap.add_argument("-c", "--config", default="spina.yaml", metavar="FILE",
                    help="desired-state YAML (default %(default)s)")
    ap.add_argument("--election-id", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args(argv)
    failed = False
    try:
        for level, msg in check(args.config, args.election_id, args.timeout):
            failed |= level == "FAIL"
            print(f"{level:<4} {msg}", flush=True)
    except (ConfigError, OSError) as e:
        print(f"spina doctor: error: {e}", file=sys.stderr)
        return 2
    return 1 if failed else 0
