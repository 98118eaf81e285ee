"""The software switch over UDP: the aggregation pipeline behind one UDP socket.

Workers are identified by their source address (admission table: ingress port 0, source
(host, port)); results go to every worker's registered address. This is the software
aggregator for users without a P4 switch and the default target of the demo and of CI.
"""
from __future__ import annotations

import logging
import random
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from softswitch.fabric import TO_GROUP, TO_SENDER, Leaf, Spine, rack_job
from softswitch.pipeline import DEFAULT_POOL_SLOTS, DEFAULT_SLOT_CAPACITY, Pipeline
from spina import wire
from spina.config import ConfigError, JobConfig
from spina.net import grow_buffers

log = logging.getLogger("spina.softswitch")

UDP_PORT_ID = 0  # the one "ingress port" of the UDP mode, for per-port counters


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

    Args:
        host, port: where to listen (port 0 picks a free one; see `.address`).
        pool_slots / slot_capacity: the register pool's size.
        faults: optional fault injection (tests).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = wire.DEFAULT_UDP_PORT,
                 pool_slots: int = DEFAULT_POOL_SLOTS, slot_capacity: int = DEFAULT_SLOT_CAPACITY,
                 faults: Faults | None = None):
        self.faults = faults
        self.pipeline = Pipeline(pool_slots, slot_capacity)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        grow_buffers(self.sock, 64 << 20)
        self.address = self.sock.getsockname()
        self._dest: dict[int, list[tuple[str, int]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.packets_in = 0
        self.packets_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.role: Leaf | Spine | None = None  # two-level aggregation (softswitch/fabric.py)

    def add_job(self, cfg: JobConfig) -> None:
        """Admit a job: its workers may send from their registered addresses only."""
        sources = {w.rank: (UDP_PORT_ID, (w.host, w.port)) for w in cfg.workers}
        with self.pipeline.lock:
            self.pipeline.add_job(cfg, sources)
            self._dest[cfg.job] = [(w.host, w.port) for w in cfg.workers]

    def add_leaf_job(self, cfg: JobConfig, rack: int,
                     upstream: tuple[tuple[int, int, tuple[str, int]], ...]) -> None:
        """Leaf role (docs/scale_out.md): aggregate rack `rack` of `cfg` (cfg.racks: the rack
        sizes, ranks rack by rack; the rack's workers send their local ranks) and send each
        slot's partials to its spine: upstream lists (slot_base, nslots, (spine host, UDP
        port)). The plan installs it (controller/plan.py)."""
        with self.pipeline.lock:
            leaf = self._role(Leaf)
            local = rack_job(cfg, rack).workers if 0 <= rack < len(cfg.racks) else ()
            leaf.add_job(cfg, rack, {w.rank: (UDP_PORT_ID, (w.host, w.port)) for w in local},
                         tuple((b, n, (UDP_PORT_ID, tuple(a))) for b, n, a in upstream))
            self._dest[cfg.job] = [(w.host, w.port) for w in local]

    def add_spine_job(self, cfg: JobConfig) -> None:
        """Spine role: `cfg`'s workers are the job's leaves (rank = rack index), its slots the
        spine's shard of the job."""
        with self.pipeline.lock:
            self._role(Spine)
            self.add_job(cfg)

    def _role(self, cls):
        if self.role is None:
            self.role = cls(self.pipeline)
        if not isinstance(self.role, cls):
            raise ConfigError(f"switch {self.address[0]}:{self.address[1]} is a "
                              f"{type(self.role).__name__.lower()}, not a {cls.__name__.lower()} "
                              "(one level per switch)")
        return self.role

    def remove_job(self, job: int) -> None:
        with self.pipeline.lock:
            if isinstance(self.role, Leaf):
                self.role.remove_job(job)
            self.pipeline.remove_job(job)
            self._dest.pop(job, None)

    def serve_forever(self) -> None:
        sock = self.sock
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
            self.packets_in += 1
            self.bytes_in += nbytes
            if self.faults is None:
                self._process(view[:nbytes], src, out, out_view)
            else:  # the injector may hold a datagram back: give it its own copy
                for p, s in self.faults.arriving(bytes(view[:nbytes]), src, held):
                    self._process(p, s, out, out_view)

    def _process(self, pkt, src, out: bytearray, out_view: memoryview) -> None:
        role = self.role
        try:
            with self.pipeline.lock:
                if role is None:
                    n, multicast, adm = self.pipeline.process_into(pkt, UDP_PORT_ID, src, out)
                else:
                    n, to, key = role.process_into(pkt, UDP_PORT_ID, src, out)
        except Exception:  # a bug must not take the switch down for every job
            log.exception("pipeline error on a packet from %s; dropped", src)
            return
        if not n:
            return
        data = out_view[:n]
        if role is None:
            targets = self._dest.get(adm.job, ()) if multicast else (src,)
        else:  # to the job's (local) workers, back to the sender, or up to a spine
            targets = (self._dest.get(key, ()) if to == TO_GROUP else (src,) if to == TO_SENDER
                       else (key[1],))
        faults, sendto = self.faults, self.sock.sendto
        for dst in targets:
            if faults is not None and faults.leaving():
                continue
            try:
                sendto(data, dst)
            except BlockingIOError:  # send buffer full (rare for UDP): wait for room once
                select.select((), (self.sock,), (), 0.2)
                try:
                    self.sock.sendto(data, dst)
                except OSError as err:
                    log.debug("send to %s failed: %s", dst, err)
                    continue
            except OSError as err:
                log.debug("send to %s failed: %s", dst, err)
                continue
            self.packets_out += 1
            self.bytes_out += n

    def shutdown(self) -> None:
        """Ask serve_forever() to return (safe from a signal handler)."""
        self._stop.set()

    def start(self) -> "UdpSwitch":
        self._thread = threading.Thread(target=self.serve_forever, name="spina-softswitch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
