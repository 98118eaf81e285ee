"""The software switch over UDP: the aggregation pipeline behind one UDP socket.

Senders are identified by their source address (admission table: ingress port 0, source
(host, port)); results go to every replica's address. This is the software aggregator for
users without a P4 switch and the default target of the demo and of CI.
"""
from __future__ import annotations

import errno
import logging
import os
import random
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from softswitch.compiled import IDLE as _IDLE, PUNT as _PUNT, SERVE_BUDGET, core_entries
from softswitch.dataplane import DATAPATHS, UDP_MODE_PORT, Dataplane
from softswitch.egress import scatter_strip
from softswitch.fabric import TO_GROUP, TO_OTHERS, TO_SENDER
from softswitch.pipeline import DEFAULT_POOL_SLOTS, DEFAULT_SLOT_CAPACITY
from spina import rows, spec, wire
from spina.config import JobConfig
from spina.net import bind_retrying, grow_buffers

log = logging.getLogger("spina.softswitch")

# The data paths a UdpSwitch can run (dataplane.DATAPATHS): softswitch/_datapath.c (built by
# make setup) serves a flat job's contributions and hands every other packet to the Python
# pipeline, in order, on the same registers; "python" runs every packet through the Python
# pipeline (the reference, for comparison). Fault injection sits between the socket and the
# pipeline: Python only. SERVE_BUDGET and serve()'s outcomes: softswitch/compiled.py.
MAX_DATAPATH_THREADS = 64
_RANK_AT = wire.FIELD_OFFSET["rank"]  # a contribution's sender: whose copy a reply is


def shard_slot_groups(threads: int, nslots: int, slot_base: int = 0) -> tuple[int, ...]:
    """A job's JobConfig.slot_groups on a switch of `threads` data-path threads: each slot's
    thread (slot % threads, as _datapath.steer_by_slot steers). Threads complete rounds in no
    common order, and the agents' fast retransmit takes a round completing out of sending
    order within a group for a loss (host_agent/recovery.py); () for one thread: one group."""
    return tuple((slot_base + i) % threads for i in range(nslots)) if threads > 1 else ()


class _Shard:
    """One data-path thread's own: its socket, compiled path, lock and Python-side counts.

    A switch with N shards has N sockets in one SO_REUSEPORT group on its address; the kernel
    hands each datagram to socket (slot % N) (_datapath.steer_by_slot), so every slot's
    registers are only ever touched by its shard's thread."""

    def __init__(self, index: int, sock: socket.socket, lock):
        self.index, self.sock, self.lock = index, sock, lock
        self.compiled = None
        self.thread: threading.Thread | None = None
        # datagrams and bytes the Python loop received and sent (the compiled path counts its
        # own), and those the compiled path punted: this thread's alone, so no lost updates
        self.py = dict(packets_in=0, packets_out=0, bytes_in=0, bytes_out=0, punted=0,
                       send_errors=0)  # datagrams a full send buffer or an error dropped


class _AllShards:
    """A sharded switch's pipeline.lock: every shard's lock, in index order.

    Why this is safe: a data-path thread holds only its own shard's lock while it serves its
    slots, and never asks for another lock while holding it; whoever takes pipeline.lock (the
    control plane's table writes and P4Runtime reads, a punted packet's Python pipeline, a
    table sync) waits for every thread to finish its batch, so it sees and changes a switch no
    data path is touching. Always in index order: no two takers deadlock."""

    def __init__(self, locks):
        self.locks = locks

    def acquire(self) -> bool:
        for lock in self.locks:
            lock.acquire()
        return True

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def _foreign_sockets(port: int, ours: set[int]) -> int:
    """IPv4 UDP sockets of this network namespace bound to `port` that are not `ours` (inodes):
    a reuseport group joins any socket of the same user on the port, silently."""
    with open("/proc/net/udp") as f:
        next(f)
        return sum(1 for line in f if int(line.split()[1].split(":")[1], 16) == port
                   and int(line.split()[9]) not in ours)


def _reuseport_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """n UDP sockets on (host, port) in one SO_REUSEPORT group of their own, steered by slot.
    Port 0: a free port, found by a socket without SO_REUSEPORT (which the kernel never puts on
    a port in use, unlike a reuseport one), then taken by the group; tried again if lost."""
    for _attempt in range(20):
        want = port
        if port == 0:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.bind((host, 0))
                want = probe.getsockname()[1]
        socks = []
        try:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                bind_retrying(s, (host, want), what="the switch's UDP port") if port \
                    else s.bind((host, want))
            if _foreign_sockets(want, {os.fstat(s.fileno()).st_ino for s in socks}):
                raise OSError(errno.EADDRINUSE, f"port {want} is also bound by another socket")
            from softswitch import _datapath
            _datapath.steer_by_slot(socks[0].fileno(), n)
            return socks
        except OSError as e:
            for s in socks:
                s.close()
            if port or e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "no free port for the data-path sockets")


@dataclass
class Faults:
    """Fault injection for tests (all probabilities per datagram, reproducible with `seed`).

    drop_in / drop_out: lose a datagram arriving at / leaving the switch; duplicate: deliver
    an arriving datagram twice; reorder: hold an arriving datagram back until after the next
    one; drop_in_match: a predicate on the arriving datagram's header (wire.Header) that
    drops it deterministically (for example the first or last packet of a call);
    service_rate: serve this many datagrams per second on average (0: as fast as it can),
    each taking an exponentially distributed time, the rest waiting in the socket's queue: a
    slow switch such as BMv2 (150-300 packets/s), whose service time varies with the host.
    """
    drop_in: float = 0.0
    drop_out: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    drop_in_match: Callable[[wire.Header], bool] | None = None
    service_rate: float = 0.0
    seed: int = 0
    dropped_in: int = 0
    dropped_out: int = 0

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self._free_at = 0.0  # service_rate: when the switch may serve its next datagram

    def arriving(self, pkt: bytes, src, held: list) -> list[tuple[bytes, object]]:
        """(datagram, source) pairs to process now, given one that arrived.

        `held` is the caller's reorder buffer.
        """
        if self.service_rate:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + self.rng.expovariate(self.service_rate)
            time.sleep(self._free_at - now)
        if self.drop_in and self.rng.random() < self.drop_in:
            self.dropped_in += 1
            return []
        if self.drop_in_match is not None and len(pkt) >= wire.HEADER_LEN:
            try:
                if self.drop_in_match(wire.unpack_header(pkt)):
                    self.dropped_in += 1
                    return []
            except wire.MalformedPacket:
                pass
        out = [(pkt, src)] * (2 if self.duplicate and self.rng.random() < self.duplicate else 1)
        if self.reorder and not held and self.rng.random() < self.reorder:
            held.extend(out)
            return []
        out += held
        held.clear()
        return out

    def leaving(self) -> bool:
        """True if a departing datagram is lost."""
        if self.drop_out and self.rng.random() < self.drop_out:
            self.dropped_out += 1
            return True
        return False


class UdpSwitch:
    """Software switch on a UDP socket. `serve_forever()` or `start()` (a thread).

    Its state is a Dataplane in UDP mode (softswitch/dataplane.py): the same tables as the L2
    mode and the P4 program, written by the controller over P4Runtime (`servicer()`, or a
    P4RuntimeServer on `.dataplane`) or, for a switch no controller programs, by `add_job`.
    Senders are admitted on port 0 by their (IPv4, UDP port); a result goes to each replica of
    its multicast group, at the address worker_rewrite gives the replica; a leaf's partial to
    the (IPv4, UDP port) leaf_upstream gives the slot.

    Args:
        host, port: where to listen (port 0 picks a free one; see `.address`).
        pool_slots / slot_capacity: the register pool's size.
        faults: optional fault injection (tests; runs the Python data path).
        datapath: "compiled" (softswitch/_datapath.c, the default) or "python" (DATAPATHS).
        datapath_threads: compiled data-path threads, each on its own socket behind the one
            address and serving the slots s with s % datapath_threads == its index (_Shard).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = wire.DEFAULT_UDP_PORT,
                 pool_slots: int = DEFAULT_POOL_SLOTS, slot_capacity: int = DEFAULT_SLOT_CAPACITY,
                 faults: Faults | None = None, datapath: str = "compiled",
                 datapath_threads: int = 1):
        if datapath not in DATAPATHS:
            raise ValueError(f"datapath {datapath!r}: one of {', '.join(DATAPATHS)}")
        if not 1 <= datapath_threads <= MAX_DATAPATH_THREADS:
            raise ValueError(f"datapath_threads {datapath_threads}: 1..{MAX_DATAPATH_THREADS}")
        self.faults = faults
        self.datapath = "python" if faults is not None else datapath
        if datapath_threads > 1 and self.datapath != "compiled":
            raise ValueError(f"datapath_threads {datapath_threads}: more than one data-path "
                             "thread needs the compiled data path (without fault injection)")
        self.dataplane = Dataplane(pool_slots, slot_capacity, udp_mode=True)
        self.pipeline = self.dataplane.pipeline
        try:
            from softswitch import _datapath
        except ImportError as e:
            if self.datapath == "compiled":
                raise RuntimeError(f"softswitch/_datapath.c is not built here ({e}): run make "
                                   "setup (or make core), or choose the python data path") from None
        if datapath_threads == 1:  # today's switch: one socket, the pipeline's own lock
            socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM)]
            try:
                bind_retrying(socks[0], (host, port), what="the switch's UDP port")
            except OSError:
                socks[0].close()
                raise
            self._shards = [_Shard(0, socks[0], self.pipeline.lock)]
        else:
            socks = _reuseport_sockets(host, port, datapath_threads)
            self._shards = [_Shard(i, s, threading.RLock()) for i, s in enumerate(socks)]
            self.pipeline.lock = _AllShards([sh.lock for sh in self._shards])
        for shard in self._shards:
            grow_buffers(shard.sock, 64 << 20)
            if self.datapath == "compiled":
                shard.compiled = _datapath.Datapath(
                    shard.sock.fileno(), self.pipeline.registers, self.pipeline.counters,
                    pool_slots, slot_capacity)
        self.sock = self._shards[0].sock
        self.address = self.sock.getsockname()
        self._compiled = self._shards[0].compiled  # run_one's (every shard has the same tables)
        self._compiled_tables = None  # what the compiled path's tables were built from
        # multicast group -> [(IPv4, UDP port)] of its replicas, derived from the tables
        # whenever they changed (Dataplane.version): no per-packet lookup of worker_rewrite.
        self._dest: dict[int, list[tuple[str, int]]] = {}
        self._dest_ranks: dict[int, list[int]] = {}  # the rank of each of a group's _dest
        self._dest_version = -1
        self._servicer = None
        self._stop = threading.Event()

    @property
    def datapath_threads(self) -> int:
        return len(self._shards)

    def slot_groups(self, nslots: int, slot_base: int = 0) -> tuple[int, ...]:
        """A job's JobConfig.slot_groups on this switch (shard_slot_groups)."""
        return shard_slot_groups(len(self._shards), nslots, slot_base)

    def shard_stats(self) -> list[dict[str, int]]:
        """Per data-path thread: the datagrams and bytes its socket received and sent (Python
        and compiled) and those it punted."""
        out = []
        for sh in self._shards:
            got = dict(sh.py)
            if sh.compiled is not None:
                for name, value in sh.compiled.stats().items():
                    if name in got:
                        got[name] += value
            out.append(got)
        return out

    def _count(self, name: str) -> int:
        return sum(got[name] for got in self.shard_stats())

    @property
    def packets_in(self) -> int:
        return self._count("packets_in")

    @property
    def packets_out(self) -> int:
        return self._count("packets_out")

    @property
    def bytes_in(self) -> int:
        return self._count("bytes_in")

    @property
    def bytes_out(self) -> int:
        return self._count("bytes_out")

    @property
    def send_errors(self) -> int:
        """Datagrams the switch meant to send and could not (a send buffer still full after
        0.2 s, an unreachable address): the Python and the compiled paths' together."""
        return self._count("send_errors")

    def add_job(self, cfg: JobConfig) -> None:
        """Admit `cfg` in this process (the one-machine path: the launcher, LocalCluster,
        tests): the rows a controller writes for a flat job (spina.rows.flat_job, each worker
        on port 0 by its address) replace the job's rows, and its slots are cleared. A switch
        that a controller programs takes its jobs from the controller instead."""
        with self.pipeline.lock:
            self.pipeline.check_job(cfg)
            self.remove_job(cfg.job)
            self.dataplane.apply(rows.flat_job(cfg, [rows.udp_sender(w.host, w.port)
                                                     for w in cfg.workers]))
            self.pipeline.clear_slots(cfg.slot_base, cfg.nslots)
        log.info("job %d admitted: %d workers, slots %d..%d, %d lanes x %d elements", cfg.job,
                 cfg.nworkers, cfg.slot_base, cfg.slot_base + cfg.nslots - 1, cfg.nlanes,
                 cfg.block_size)

    def remove_job(self, job: int) -> None:
        """Delete the job's rows and clear the slots it was admitted for."""
        with self.pipeline.lock:
            for base, n in self.pipeline.job_slots(job):
                self.pipeline.clear_slots(base, n)
            self.dataplane.remove_job(job)

    def servicer(self, device_id: int = 0):
        """The P4Runtime servicer over this switch's tables (one per switch), for a controller
        in this process (controller.p4rt.Connection.in_process) or a P4RuntimeServer."""
        if self._servicer is None:
            from softswitch.p4runtime_server import SoftSwitchServicer
            self._servicer = SoftSwitchServicer(self.dataplane, device_id)
        return self._servicer

    def destinations(self) -> dict[int, list[tuple[str, int]]]:
        """Multicast group -> the (IPv4, UDP port) of its replicas, as the data path sends."""
        with self.pipeline.lock:
            if self.dataplane.version != self._dest_version:
                self._sync()
            return {g: list(d) for g, d in self._dest.items()}

    def _sync(self) -> None:
        """Each multicast group's destinations, from its replicas' worker_rewrite rows (the
        caller holds pipeline.lock)."""
        dp = self.dataplane
        dest, ranks = {}, {}
        for grp, replicas in dp.mcast_groups.items():
            out, rk = [], []
            for _port, rid in replicas:
                rw = dp.worker_rewrite.get(rid)
                if rw is not None:  # P4: a replica without a rewrite is dropped
                    out.append((socket.inet_ntoa(rw[1]), rw[2]))
                    rk.append(spec.rid_rank(rid))
            dest[grp], ranks[grp] = out, rk
        self._dest, self._dest_ranks, self._dest_version = dest, ranks, dp.version

    def _tables_now(self) -> tuple:
        dp, pipe = self.dataplane, self.pipeline
        return dp.version, pipe.version, pipe.hold_newer_rounds

    def _sync_compiled(self) -> None:
        """Every shard's compiled tables from the flat jobs' admission rows and destinations,
        whenever a table, a group or the hold changed (the caller holds pipeline.lock). A job
        with a leaf or spine role is left to the Python pipeline, as is any row the compiled
        path cannot take (logged: Python then serves every packet)."""
        dp, pipe = self.dataplane, self.pipeline
        now = self._tables_now()
        if now == self._compiled_tables:
            return
        if dp.version != self._dest_version:
            self._sync()
        dests, first = [], {}

        def place(grp: int) -> tuple[int, int]:
            if grp not in first:  # (ip, port, rank): the rank for reduce-scatter's ScatterStrip
                first[grp] = len(dests), len(self._dest.get(grp, ()))
                dests.extend((*d, r) for d, r in zip(self._dest.get(grp, ()),
                                                     self._dest_ranks.get(grp, ())))
            return first[grp]

        entries = core_entries(dp, UDP_MODE_PORT, place)
        for shard in self._shards:
            if shard.compiled is None:
                continue
            try:
                shard.compiled.set_tables(entries, dests, pipe.hold_newer_rounds, True)
            except (ValueError, TypeError, OverflowError) as e:
                log.error("compiled data path: %s; the Python pipeline serves every packet", e)
                shard.compiled.set_tables([], [], pipe.hold_newer_rounds)
        self._compiled_tables = now

    def _serve_compiled(self, shard: _Shard) -> None:
        sock, lock, stop, fast = shard.sock, shard.lock, self._stop, shard.compiled
        sock.settimeout(0.0)
        out = bytearray(self.pipeline.max_packet_len)  # the punted packets' results leave here
        out_view = memoryview(out)
        log.info("software switch listening on %s:%d (compiled data path, thread %d of %d)",
                 *self.address, shard.index + 1, len(self._shards))
        while not stop.is_set():
            try:
                with lock:  # this shard's slots alone (the whole switch when it is the only one)
                    current = self._tables_now() == self._compiled_tables
                    if current:
                        outcome, pkt, src = fast.serve(SERVE_BUDGET)
                if not current:  # a table changed: every shard's tables, under every lock
                    with self.pipeline.lock:
                        self._sync_compiled()
                    continue
            except Exception:  # a bug must not take the switch down for every job
                log.exception("compiled data path failed; the Python data path serves from now on")
                with lock:
                    for name, value in fast.stats().items():  # its counts stay the switch's
                        if name in shard.py:
                            shard.py[name] += value
                    shard.compiled = None
                    if shard.index == 0:
                        self._compiled = None
                return self._serve_python(shard)
            if outcome == _PUNT:
                shard.py["punted"] += 1
                self._process(pkt, src, out, out_view, shard)
            elif outcome == _IDLE:
                select.select((sock,), (), (), 0.2)
        # Stopped: a datagram received is still served. Budget 0 ends the batch a punt cut
        # short (if one did) without reading the socket again.
        while True:
            with lock:
                outcome, pkt, src = fast.serve(0)
            if outcome != _PUNT:
                break
            shard.py["punted"] += 1
            self._process(pkt, src, out, out_view, shard)

    def _serve_shard(self, shard: _Shard) -> None:
        if shard.compiled is not None:
            return self._serve_compiled(shard)
        return self._serve_python(shard)

    def serve_forever(self) -> None:
        """Serve until shutdown(): shard 0 in this thread, any other in a thread of its own
        (all joined before this returns)."""
        others = self._start_threads(self._shards[1:])
        try:
            self._serve_shard(self._shards[0])
        finally:
            self._stop.set()
            for t in others:
                t.join()

    def _start_threads(self, shards) -> list[threading.Thread]:
        threads = []
        for shard in shards:
            shard.thread = threading.Thread(target=self._serve_shard, args=(shard,), daemon=True,
                                            name=f"spina-softswitch-{shard.index}")
            shard.thread.start()
            threads.append(shard.thread)
        return threads

    def _serve_python(self, shard: _Shard) -> None:
        sock, counts = shard.sock, shard.py
        held: list = []  # reorder buffer of the fault injector
        # Non-blocking socket, select() only when idle: a socket with a timeout makes CPython
        # poll() before every recvfrom and sendto, one extra system call per datagram.
        sock.settimeout(0.0)
        buf = bytearray(wire.MAX_UDP_PAYLOAD + 1)  # every datagram lands here: no allocation
        view = memoryview(buf)
        out = bytearray(self.pipeline.max_packet_len)  # and every packet leaves from here
        out_view = memoryview(out)
        recv = sock.recvfrom_into
        stop = self._stop
        log.info("software switch listening on %s:%d", *self.address)
        while not stop.is_set():
            try:
                nbytes, src = recv(buf)
            except BlockingIOError:
                select.select((sock,), (), (), 0.2)
                continue
            except OSError:
                if stop.is_set():
                    break
                continue  # e.g. ICMP errors reported on the socket; never stop serving
            counts["packets_in"] += 1
            counts["bytes_in"] += nbytes
            if self.faults is None:
                self._process(view[:nbytes], src, out, out_view, shard)
            else:  # the injector may hold a datagram back: give it its own copy
                for p, s in self.faults.arriving(bytes(view[:nbytes]), src, held):
                    self._process(p, s, out, out_view, shard)

    def _route(self, pkt, src, out) -> tuple[int, tuple, tuple | None]:
        """The Python pipeline on one datagram: (n, destinations, stripped) of the packet
        out[:n] that leaves (n = 0: none); stripped: None, or (datagram, destinations) of a
        reduce-scatter result's header-only copy for the ranks owning none of its blocks
        (egress.scatter_strip). The caller holds pipeline.lock."""
        dp = self.dataplane
        if dp.version != self._dest_version:
            self._sync()
        n, to, key, grp = dp.roles.route_into(pkt, UDP_MODE_PORT, src, out)
        if not n:
            return 0, (), None
        # To the job's (local) workers, back to the sender, up to the slot's spine, or (an
        # all-gather packet) to every worker but its sender.
        if to == TO_OTHERS:
            return n, tuple(d for d in self._dest.get(grp, ()) if d != src), None
        owners = dp.roles.owners(pkt, out)
        if owners and to == TO_GROUP:
            dests, ranks = self._dest.get(grp, ()), self._dest_ranks.get(grp, ())
            mine = tuple(d for d, r in zip(dests, ranks) if owners >> r & 1)
            rest = tuple(d for d, r in zip(dests, ranks) if not owners >> r & 1)
            return n, mine, (scatter_strip(out[:n]), rest) if rest else None
        if owners and to == TO_SENDER and not owners >> pkt[_RANK_AT] & 1:
            return n, (), (scatter_strip(out[:n]), (src,))
        return n, (tuple(self._dest.get(grp, ())) if to == TO_GROUP else (src,)
                   if to == TO_SENDER else (key[1],)), None

    def run_one(self, pkt, src) -> list[tuple[tuple[str, int], bytes]]:
        """One datagram from `src` through this switch's data path, without sockets: the
        (destination, datagram) pairs that leave. The compiled path first, as serve_forever
        runs it; what it punts goes to the Python pipeline (counted in `punted`)."""
        out = bytearray(self.pipeline.max_packet_len)
        with self.pipeline.lock:
            if self._compiled is not None:
                self._sync_compiled()
                n, to, dests, stripped = self._compiled.process(pkt, src, out)
                if n >= 0:
                    head = scatter_strip(out[:n]) if stripped else b""
                    return [(d, bytes(out[:n])) for d in (
                        dests if to in (TO_GROUP, TO_OTHERS) else [src])
                            ] + [(d, head) for d in stripped] if n else []
                self._shards[0].py["punted"] += 1
            n, targets, stripped = self._route(pkt, src, out)
        return [(d, bytes(out[:n])) for d in targets] + (
            [(d, stripped[0]) for d in stripped[1]] if stripped else [])

    @property
    def punted(self) -> int:
        """Datagrams the compiled path handed to the Python pipeline."""
        return self._count("punted")

    def _process(self, pkt, src, out: bytearray, out_view: memoryview, shard: _Shard) -> None:
        try:
            with self.pipeline.lock:
                n, targets, stripped = self._route(pkt, src, out)
        except Exception:  # a bug must not take the switch down for every job
            log.exception("pipeline error on a packet from %s; dropped", src)
            return
        if n:
            self._send(shard, out_view[:n], targets)
        if stripped:
            self._send(shard, *stripped)

    def _send(self, shard: _Shard, data, targets) -> None:
        """Send `data` to each of `targets` (the fault injector may lose a copy)."""
        n = len(data)
        sock, counts, faults = shard.sock, shard.py, self.faults
        sendto = sock.sendto
        for dst in targets:
            if faults is not None and faults.leaving():
                continue
            try:
                sendto(data, dst)
            except BlockingIOError:  # send buffer full (rare for UDP): wait for room once
                select.select((), (sock,), (), 0.2)
                try:
                    sendto(data, dst)
                except OSError as err:
                    log.debug("send to %s failed: %s", dst, err)
                    counts["send_errors"] += 1
                    continue
            except OSError as err:
                log.debug("send to %s failed: %s", dst, err)
                counts["send_errors"] += 1
                continue
            counts["packets_out"] += 1
            counts["bytes_out"] += n

    def shutdown(self) -> None:
        """Ask serve_forever() to return (safe from a signal handler)."""
        self._stop.set()

    def start(self) -> "UdpSwitch":
        """Serve in the background: one thread per shard."""
        self._start_threads(self._shards)
        return self

    def stop(self) -> None:
        self._stop.set()
        for shard in self._shards:
            if shard.thread is not None and shard.thread is not threading.current_thread():
                shard.thread.join(timeout=5)
        for shard in self._shards:
            shard.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
