"""The software switch over UDP: the aggregation pipeline behind one UDP socket.

Workers are identified by their source address (admission table: ingress port 0, source
(host, port)); results go to every worker's registered address. This is the software
aggregator for users without a P4 switch and the default target of the demo and of CI.
"""
from __future__ import annotations

import logging
import socket
import threading

from softswitch.pipeline import DEFAULT_POOL_SLOTS, DEFAULT_SLOT_CAPACITY, Pipeline
from spina import wire
from spina.config import JobConfig
from spina.net import grow_buffers

log = logging.getLogger("spina.softswitch")

UDP_PORT_ID = 0  # the one "ingress port" of the UDP mode, for per-port counters


class UdpSwitch:
    """Software switch on a UDP socket. `serve_forever()` or `start()` (a thread).

    Args:
        host, port: where to listen (port 0 picks a free one; see `.address`).
        pool_slots / slot_capacity: the register pool's size.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = wire.DEFAULT_UDP_PORT,
                 pool_slots: int = DEFAULT_POOL_SLOTS, slot_capacity: int = DEFAULT_SLOT_CAPACITY):
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

    def add_job(self, cfg: JobConfig) -> None:
        """Admit a job: its workers may send from their registered addresses only."""
        sources = {w.rank: (UDP_PORT_ID, (w.host, w.port)) for w in cfg.workers}
        self.pipeline.add_job(cfg, sources)
        self._dest[cfg.job] = [(w.host, w.port) for w in cfg.workers]

    def remove_job(self, job: int) -> None:
        self.pipeline.remove_job(job)
        self._dest.pop(job, None)

    def serve_forever(self) -> None:
        sock, pipe = self.sock, self.pipeline
        sock.settimeout(0.2)
        log.info("software switch listening on %s:%d", *self.address)
        while not self._stop.is_set():
            try:
                pkt, src = sock.recvfrom(wire.MAX_UDP_PAYLOAD + 1)
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                continue  # e.g. ICMP errors reported on the socket; never stop serving
            self.packets_in += 1
            self.bytes_in += len(pkt)
            try:
                emits = pipe.process(pkt, UDP_PORT_ID, src)
            except Exception:  # a bug must not take the switch down for every job
                log.exception("pipeline error on a packet from %s; dropped", src)
                continue
            for e in emits:
                targets = self._dest.get(e.job, ()) if e.multicast else (src,)
                for dst in targets:
                    try:
                        sock.sendto(e.data, dst)
                    except OSError as err:
                        log.debug("send to %s failed: %s", dst, err)
                        continue
                    self.packets_out += 1
                    self.bytes_out += len(e.data)

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
