"""`spina doctor -c spina.yaml`: check a deployment against its desired-state file.

One line per check, `ok`, `warn` or `FAIL`, and exit 1 if any failed:
  - each switch answers P4Runtime and runs the pipeline the file names (same cookie as
    `deploy` computes from the P4Info and device config);
  - each job is admitted on its switch with the file's slot range and epoch (under `serve`
    each run advances the epoch: a newer one on the switch is reported, not failed), and each
    of its workers has its own admission entry (switch port, address, UDP port, job, rank);
  - the switch's data port counts a probe (one INA packet from an address it does not
    admit: port_unadmitted rises);
  - each rank's agent file matches the switch (address, slots, lanes, its admitted address);
  - no round of a job waits for workers, unchanged over the probe timeout (stale rounds);
  - the run rendezvous at the file's address is this file's (`spina serve`): its jobs and
    file, not another deployment's;
  - a job's largest packet (all lanes present) fits the MTU of the route to its switch (P4
    targets; the UDP-mode software switch takes datagrams up to 64 KB, fragmented by IP);
  - each worker's address is an address of this host, or its host answers ICMP from here
    (a timestamp request, else an echo request); no answer, or no route, fails naming the
    worker. The worker's UDP port is not probed: an agent listens only while it runs;
  - clocks: whether the kernel says this host's clock is synchronized (adjtimex), and the
    offset of every other host that answers an ICMP timestamp request (the workers' hosts and
    the hosts of the switches' P4Runtime servers) from this host's clock, to the millisecond.
    P4Runtime carries no time, so a switch is compared through the host its server runs on.
    SpINA itself needs no agreeing clocks (epochs, not time, keep runs apart); a difference
    over CLOCK_TOLERANCE_MS is a warning because logs of different hosts no longer line up.

ICMP needs a raw socket (root or CAP_NET_RAW) for timestamp requests; otherwise an echo
through a ping socket (net.ipv4.ping_group_range) checks reachability and clocks are not
compared, and without either the reachability of other hosts is a warning, not a pass.
"""
from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import select
import socket
import struct
import subprocess
import time
from dataclasses import dataclass

from controller.controller import Controller
from controller.p4rt import P4RuntimeError
from controller.pipeline import cookie_of, load_pipeline
from controller.state import load
from spina import cli, log as spina_log, rendezvous, spec, wire
from spina.config import Assignment, ConfigError
from spina.p4runtime import decode

IP_UDP = 28  # IPv4 + UDP headers
CLOCK_TOLERANCE_MS = 100
ICMP_ECHO_REPLY, ICMP_ECHO, ICMP_TIMESTAMP, ICMP_TIMESTAMP_REPLY = 0, 8, 13, 14
DAY_MS = 86_400_000
# Epochs run 1, 2, ..., 2^16 - 1, then 1 again (0 is never used: spina.rendezvous.next_epoch),
# in the admit action's 16-bit epoch parameter.
EPOCH_CYCLE = (1 << dict(spec.ACTIONS["admit"].params)["epoch"]) - 1


def epoch_runs_after(epoch: int, since: int) -> int:
    """How many runs `epoch` is after `since` on the epoch cycle, across its wrap-around:
    0 the same, 1 .. EPOCH_CYCLE // 2 newer, more: older (that many runs newer is no run)."""
    return (epoch - since) % EPOCH_CYCLE


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


def is_local(ip: str) -> bool:
    """True if `ip` is an address of this host (it can be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((ip, 0))
            return True
        except OSError:
            return False


def has_route(ip: str) -> bool:
    """True if the kernel has a route to `ip` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
            return True
        except OSError:
            return False


@dataclass
class Probe:
    """What one ICMP probe of a host found."""
    answered: bool | None       # None: no probe could be sent (no permission)
    how: str                    # "timestamp", "echo", or why nothing was sent
    rtt_ms: float | None = None
    offset_ms: float | None = None  # the host's clock minus ours (timestamp replies only)


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def _icmp(kind: int, ident: int, seq: int, body: bytes) -> bytes:
    head = struct.pack("!BBHHH", kind, 0, 0, ident, seq)
    return struct.pack("!BBHHH", kind, 0, _checksum(head + body), ident, seq) + body


def _ms_of_day(t: float) -> int:
    """Milliseconds since midnight UT: the unit of ICMP timestamps (RFC 792)."""
    return int(t * 1000) % DAY_MS


def clock_offset_ms(originate: int, receive: int, transmit: int, back: int) -> float:
    """The other host's clock minus ours from one ICMP timestamp exchange (all four in ms of
    the day: our send, its receive, its send, our receive), as NTP does: the mean of the two
    one-way differences, so a symmetric path delay cancels. Wraps at midnight."""
    def wrap(d: int) -> int:
        return (d + DAY_MS // 2) % DAY_MS - DAY_MS // 2
    return (wrap(receive - originate) + wrap(transmit - back)) / 2


def _exchange(sock, ip: str, packet: bytes, want: int, ident: int | None, raw: bool,
              timeout: float):
    """Send `packet` to `ip`, return (reply ICMP bytes, receive time) of type `want`, or None."""
    t0 = time.time()
    sock.sendto(packet, (ip, 0))
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        data, src = sock.recvfrom(2048)
        back = time.time()
        if raw:
            data = data[(data[0] & 0x0F) * 4:]  # past the IP header
        if src[0] != ip or len(data) < 8 or data[0] != want:
            continue
        if ident is not None and struct.unpack_from("!H", data, 4)[0] != ident:
            continue
        return data, t0, back
    return None


def icmp_probe(ip: str, timeout: float = 1.0) -> Probe:
    """Probe `ip`: an ICMP timestamp request over a raw socket (an answer gives the clock
    offset too), else an echo request (raw or ping socket)."""
    ident = os.getpid() & 0xFFFF
    try:
        sock, raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), True
    except PermissionError:
        try:  # the kernel's ping socket: echo only, and it sets the identifier itself
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
            raw = False
        except PermissionError:
            return Probe(None, "no ICMP socket here (needs CAP_NET_RAW or "
                               "net.ipv4.ping_group_range)")
    with sock:
        try:
            if raw:
                orig = _ms_of_day(time.time())
                got = _exchange(sock, ip, _icmp(ICMP_TIMESTAMP, ident, 1,
                                                struct.pack("!III", orig, 0, 0)),
                                ICMP_TIMESTAMP_REPLY, ident, raw, timeout)
                if got is not None and len(got[0]) >= 20:
                    data, t0, back = got
                    o, r, t = struct.unpack_from("!III", data, 8)
                    if not (r | t) & 0x80000000:  # high bit: not ms since midnight UT
                        return Probe(True, "timestamp", 1e3 * (back - t0),
                                     clock_offset_ms(o, r, t, _ms_of_day(back)))
            got = _exchange(sock, ip, _icmp(ICMP_ECHO, ident, 2, b"spina doctor"),
                            ICMP_ECHO_REPLY, ident if raw else None, raw, timeout)
        except OSError as e:
            return Probe(False, f"send failed: {e.strerror or e}")
    if got is None:
        return Probe(False, "no reply")
    return Probe(True, "echo", 1e3 * (got[2] - got[1]))


def local_clock() -> tuple[str, str]:
    """(level, text) about this host's clock from the kernel's NTP state (adjtimex)."""
    try:
        buf = ctypes.create_string_buffer(512)  # larger than struct timex
        state = ctypes.CDLL(None, use_errno=True).adjtimex(buf)
        maxerror_us = struct.unpack_from("l", buf.raw, 24)[0]  # Linux x86-64/arm64 layout
    except (OSError, AttributeError):
        return "warn", "this host: cannot read the kernel's clock state (adjtimex)"
    if state < 0 or state == 5:  # TIME_ERROR: nothing keeps the clock synchronized
        return "warn", ("this host: the kernel says the clock is not synchronized (no NTP "
                        "client running?); other hosts are compared with it")
    return "ok", (f"this host: clock synchronized (kernel estimate: within "
                  f"{maxerror_us / 1000:.0f} ms)")


def _clock_line(what: str, p: Probe) -> tuple[str, str]:
    spread = p.rtt_ms / 2 + 1  # timestamps are whole ms; the path may be asymmetric
    text = (f"{what}: clock {p.offset_ms:+.0f} ms from this host's (+- {spread:.0f} ms, "
            f"ICMP timestamp)")
    if abs(p.offset_ms) - spread > CLOCK_TOLERANCE_MS:
        return "warn", text + f", more than {CLOCK_TOLERANCE_MS} ms: logs of the hosts misalign"
    return "ok", text


def admitted_workers(s) -> set[tuple]:
    """{(ingress_port, src_addr, src_port, job, rank)} of the switch's admission entries."""
    t = s.conn.index.get("tables", "admission")
    names = {m.id: m.name for m in t.match_fields}
    out = set()
    for e in s.conn.read_table("admission"):
        f = {names[m.field_id]: decode(m.exact.value) for m in e.match}
        out.add((f["ingress_port"], str(ipaddress.IPv4Address(f["src_addr"])), f["src_port"],
                 f["job"], f["rank"]))
    return out


def _port_drops(s, ports) -> dict[str, int]:
    """{port_malformed, port_unadmitted: summed over `ports`} as the switch counts them."""
    got = {**s.ina_check.read_counters(ports), **s.admission.read_counters(ports)}
    return {c: sum(got.get(c, {}).values()) for c in ("port_malformed", "port_unadmitted")}


def _data_port_checks(state, name, sw, s, timeout: float):
    """One INA packet from an address the switch does not admit, to its data port: a switch
    that gets it counts it in port_unadmitted. Nothing else happens to it (no job's slot)."""
    where = f"{sw.address}:{sw.udp_port}"
    if not has_route(sw.address):
        yield "warn", f"switch {name}: data port {where} not probed: no route from here"
        return
    ports = list(sw.ports)
    before = _port_drops(s, ports)
    job = next(j for j in range(1, 1 << 16) if j not in state.jobs)  # admitted nowhere
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(wire.pack(wire.Header(job=job, nlanes=1, block_size=8), [wire.END]),
                 (sw.address, sw.udp_port))
    deadline = time.monotonic() + timeout
    while True:
        after = _port_drops(s, ports)
        rose = [f"{c} +{after[c] - before[c]}" for c in after if after[c] > before[c]]
        if rose:
            yield "ok", f"switch {name}: data port {where} counts a probe ({', '.join(rose)})"
            return
        if time.monotonic() >= deadline:
            yield "FAIL", (f"switch {name}: a probe to its data port {where} was not counted "
                           f"within {timeout:g} s (not reachable from here, or not this "
                           "switch's address and port)")
            return
        time.sleep(0.05)


ROUND_REGISTERS = ("slot_round", "slot_bitmap", "slot_count")


def _stale_round_checks(name, sw, s, jobs, wait: float):
    """Rounds a job started and its workers have not all joined, unchanged over `wait` s: a
    slot copy (2 per slot) whose count is above 0 and below the job's worker count (a
    completed round keeps its count until a newer one takes the copy). `jobs`: (Job, the
    admit parameters) pairs. Read twice only if a copy waits at the first read."""
    if not jobs:
        return
    if sw.target == "tofino":
        yield "warn", (f"switch {name}: stale rounds not checked (doctor does not read the "
                       "TNA program's slot registers)")
        return

    def copies(j):
        return list(zip(*(s.registers.read_cells(r, 2 * j.slot_base, 2 * j.nslots)
                          for r in ROUND_REGISTERS)))

    def waiting(rows, n):
        return {i: row for i, row in enumerate(rows) if 0 < row[2] < n}
    first = {j.id: waiting(copies(j), p["nworkers"]) for j, p in jobs}
    if any(first.values()):
        time.sleep(wait)
    for j, p in jobs:
        if not first[j.id]:
            yield "ok", f"job {j.id}: no round waits for a worker on {name} ({j.nslots} slots)"
            continue
        now = waiting(copies(j), p["nworkers"])
        stuck = sorted((i, row) for i, row in first[j.id].items() if now.get(i) == row)
        if not stuck:
            yield "ok", (f"job {j.id}: its rounds on {name} move ({len(first[j.id])} slot "
                         f"copies were waiting for workers {wait:g} s before)")
            continue
        ranks = sorted({r for _, (_, bits, _) in stuck for r in range(p["nworkers"])
                        if not bits >> r & 1})
        slots = sorted({j.slot_base + i // 2 for i, _ in stuck})
        i, (rnd, _, _) = stuck[0]
        yield "warn", (f"job {j.id}: {len(slots)} of its {j.nslots} slots on {name} wait for "
                       f"rank {', '.join(map(str, ranks))} (slot {j.slot_base + i // 2} at "
                       f"round {rnd} first), unchanged for {wait:g} s: a worker stopped "
                       "mid-call? The job's next run clears them")


def _agent_file_checks(state, name, sw, ctl, j, params: dict, workers: set):
    """Each rank's agent file against the switch: its address and port, the job's slots,
    block size and lanes, and the rank's own admitted address; the rendezvous it names."""
    bad = False
    for rank, m in enumerate(j.members):
        path = ctl.agent_path(j.id, rank)
        try:
            a = Assignment.load(path)
        except ConfigError as e:
            yield "FAIL", f"worker {m}: {e} (`spina deploy` writes it)"
            bad = True
            continue
        wrong = []
        if a.switch != (sw.address, sw.udp_port):
            wrong.append(f"switch {a.switch[0]}:{a.switch[1]}, {name} listens on "
                         f"{sw.address}:{sw.udp_port}")
        for f in ("slot_base", "nslots", "nworkers", "block_size", "nlanes"):
            if getattr(a.job, f) != params[f]:
                wrong.append(f"{f} {getattr(a.job, f)}, {name} has {params[f]}")
        me = a.job.workers[a.rank] if a.rank < len(a.job.workers) else None
        if me is None or not any(w[1:] == (me.host, me.port, j.id, a.rank) for w in workers):
            wrong.append(f"rank {a.rank} at {me.host}:{me.port}, which {name} does not admit"
                         if me else f"rank {a.rank} has no worker address")
        if a.rendezvous != state.rendezvous:
            wrong.append("rendezvous " + (":".join(map(str, a.rendezvous)) if a.rendezvous
                                          else "none") + ", the file's is "
                         + ":".join(map(str, state.rendezvous)))
        if wrong:
            yield "FAIL", f"worker {m}: {path} says {'; '.join(wrong)} (`spina deploy`)"
            bad = True
    if not bad:
        # the folder as found from here (agents_dir is relative to the YAML file)
        folder = os.path.normpath(ctl.agent_path(j.id, 0).parent)
        yield "ok", f"job {j.id}: agent files {folder}/job{j.id}-rank*.json match {name}"


def rendezvous_check(state, timeout: float) -> tuple[str, str]:
    """Whether the run rendezvous at the file's address is this file's (`spina serve -c
    FILE`): it answers `hello` with this file's jobs and worker counts, and with this file
    as its source; another deployment's rendezvous on the address is named, not taken for
    ours. It joins nothing."""
    host, port = state.rendezvous
    where = f"rendezvous {host}:{port}"
    try:
        info = rendezvous.probe((host, port), timeout)
    except OSError as e:
        return "FAIL", (f"{where}: {e.strerror or e}: no `spina serve` answers there (agents "
                        "stop at their first call)")
    if info is None:
        return "FAIL", f"{where}: answers, but not as a SpINA run rendezvous"
    ours = {j: n for j, (n, _) in state.run_jobs().items()}
    theirs = {int(j): n for j, n in info.get("jobs", {}).items()}
    mine = str(state.path.resolve()) if state.path else None
    whose = rendezvous.describe(info)
    if theirs != ours or (info.get("source") and mine and info["source"] != mine):
        return "FAIL", (f"{where}: is {whose}, not this file's (jobs {sorted(ours)}, "
                        f"{mine}): another deployment holds the address; agents would join "
                        "its runs (give this file another `rendezvous`)")
    return "ok", f"{where}: serves this file's jobs {sorted(ours)} ({info.get('owner')} pid " \
                 f"{info.get('pid')})"


def _switch_checks(state, name, sw, ctl, probe_timeout: float = 1.0):
    try:  # a switch that does not answer fails here, not with a traceback
        s = ctl.session(name)
        cur = s.conn.get_pipeline()
    except (P4RuntimeError, OSError) as e:
        said = str(e) if sw.grpc in str(e) else f"no answer at {sw.grpc}: {e}"
        yield "FAIL", f"switch {name}: {said}"
        return
    yield "ok", f"switch {name}: answers P4Runtime at {sw.grpc}"
    info, cfg = load_pipeline(state, sw)
    if cur is None or not cur.p4info.tables:
        yield "FAIL", f"switch {name}: runs no pipeline (run `spina deploy`)"
        return
    if cur.HasField("cookie") and cur.cookie.cookie == cookie_of(info, cfg):
        yield "ok", f"switch {name}: pipeline matches the P4Info"
    else:
        yield "FAIL", (f"switch {name}: its pipeline differs from the file's P4Info "
                       "(`spina deploy` pushes it)")
    s.attach()
    yield from _data_port_checks(state, name, sw, s, probe_timeout)
    installed = s.admission.installed_params()
    workers = admitted_workers(s)
    admitted = []
    for j in state.jobs_on(sw):
        params = installed.get(j.id)
        if params is None:
            yield "FAIL", f"job {j.id}: not admitted on switch {name} (`spina deploy`)"
            continue
        admitted.append((j, params))
        base, n, epoch = params["slot_base"], params["nslots"], params["epoch"]
        if (base, n) != (j.slot_base, j.nslots):
            yield "FAIL", (f"job {j.id}: switch {name} admits slots {base}..{base + n - 1}"
                           f", the file says {j.slot_base}..{j.slot_base + j.nslots - 1}")
        elif epoch == j.epoch:
            yield "ok", f"job {j.id}: admitted on {name}, slots and epoch {epoch} agree"
        elif epoch_runs_after(epoch, j.epoch) <= EPOCH_CYCLE // 2:
            yield "warn", (f"job {j.id}: switch {name} runs epoch {epoch}, the file says "
                           f"{j.epoch} (a `serve` run advanced it)")
        else:
            yield "FAIL", (f"job {j.id}: switch {name} runs epoch {epoch}, older than the "
                           f"file's {j.epoch}")
        for rank, m in enumerate(j.members):
            w = state.workers[m]
            if (w.switch_port, w.ip, w.udp_port, j.id, rank) in workers:
                yield "ok", (f"worker {m}: admitted on {name} as job {j.id} rank {rank} from "
                             f"{w.ip}:{w.udp_port} (port {w.switch_port})")
            else:
                yield "FAIL", (f"worker {m}: switch {name} does not admit job {j.id} rank "
                               f"{rank} from {w.ip}:{w.udp_port} (port {w.switch_port}); "
                               "`spina deploy`")
        yield from _agent_file_checks(state, name, sw, ctl, j, params, workers)
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
    yield from _stale_round_checks(name, sw, s, admitted, probe_timeout)


def _host_checks(state, probe_timeout: float):
    """Reachability of every worker's address, then the clocks of every host involved."""
    probes: dict[str, Probe] = {}  # ip -> its probe; a host's name list, in file order
    names: dict[str, list[str]] = {}
    for w in state.workers.values():
        if is_local(w.ip):
            yield "ok", f"worker {w.name}: {w.ip} is an address of this host"
            continue
        names.setdefault(w.ip, []).append(w.name)
        if not has_route(w.ip):
            yield "FAIL", f"worker {w.name}: no route to {w.ip}"
            continue
        p = probes.get(w.ip) or probes.setdefault(w.ip, icmp_probe(w.ip, probe_timeout))
        if p.answered is None:
            yield "warn", f"worker {w.name}: {w.ip} not probed: {p.how}"
        elif p.answered:
            yield "ok", f"worker {w.name}: {w.ip} answers ICMP {p.how} ({p.rtt_ms:.1f} ms)"
        else:
            yield "FAIL", (f"worker {w.name}: {w.ip} does not answer ICMP from here ({p.how} "
                           f"in {probe_timeout:g} s)")
    for name, sw in state.switches.items():  # P4Runtime answered: its host is only timed
        host = sw.grpc.rpartition(":")[0].strip("[]")
        try:
            ip = socket.gethostbyname(host)
        except OSError:
            continue
        if not is_local(ip):
            names.setdefault(ip, []).append(f"switch {name}")
            if ip not in probes and has_route(ip):
                probes[ip] = icmp_probe(ip, probe_timeout)
    yield local_clock()
    for ip, p in probes.items():
        what = f"host {ip} ({', '.join(names[ip])})"
        if p.offset_ms is not None:
            yield _clock_line(what, p)
        elif p.answered:
            yield "warn", f"{what}: clock not compared (no ICMP timestamp reply)"


def check(config: str, timeout: float = 10.0, probe_timeout: float = 1.0):
    """Yield (level, message) for every check of the deployment in `config`. Read-only: no
    election id, so it never contests primary with a running controller; the one thing it
    changes is the switch's port_unadmitted count (+1 per switch, the data port's probe)."""
    state = load(config)
    with Controller(state, None, timeout=timeout) as ctl:
        for name, sw in state.switches.items():
            yield from _switch_checks(state, name, sw, ctl, probe_timeout)
    yield rendezvous_check(state, min(timeout, 5.0))
    yield from _host_checks(state, probe_timeout)


def parser(prog: str = "spina doctor") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n", 1)[0].rstrip(".")
                            + ": the switch answers, its pipeline matches the P4Info, its data "
                            "port counts a probe, every job is admitted with the file's slots "
                            "and epoch and every worker with its address, the agent files "
                            "match the switch, no round is stale, the rendezvous answers, "
                            "every worker address is local or answers ICMP, packets fit the "
                            "MTU, clocks agree (ICMP timestamps). Exit 1 if a check fails.")
    ap.add_argument("-c", "--config", metavar="FILE", type=cli.input_file,
                    help="desired-state YAML (default spina.yaml)")
    ap.add_argument("--timeout", type=cli.positive_float, default=10.0,
                    help="seconds to wait for a switch (default %(default)s)")
    ap.add_argument("--probe-timeout", type=cli.positive_float, default=1.0, metavar="SECONDS",
                    help="seconds to wait for each host's ICMP reply, the data port's "
                         "count and a waiting round to move (default %(default)s)")
    spina_log.add_options(ap, level="WARNING")
    return ap


def main(argv=None, prog: str = "spina doctor") -> int:
    ap = parser(prog)
    args = ap.parse_args(argv)
    spina_log.setup("doctor", args.log_level, args.log_format)
    failed = False
    try:
        for level, msg in check(args.config or "spina.yaml", args.timeout, args.probe_timeout):
            failed |= level == "FAIL"
            print(f"{level:<4} {msg}", flush=True)
    except (ConfigError, OSError) as e:
        return cli.fail(ap.prog, e)
    return 1 if failed else 0
