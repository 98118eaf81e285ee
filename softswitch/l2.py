"""The software switch in L2 mode: a Dataplane (softswitch/dataplane.py, the P4 program's whole
pipeline on Ethernet frames) attached to network interfaces with AF_PACKET raw sockets, numbered
like BMv2's `-i N@intf`, so it can stand where BMv2 stands (veth, mininet links).

With a compiled Dataplane (the default) the common case never reaches Python: per readable
port, softswitch/_datapath_l2.c receives a batch of frames (recvmmsg), serves a flat job's
contributions on the pipeline's registers and sends every result copy (one sendmmsg per egress
port and batch), the GIL released under the pipeline lock; a frame it cannot serve comes back
here and goes through `Dataplane.process_python` in arrival order. While a port is
rate-limited or shaped (softswitch/egress.py) every frame is Python's.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time

from softswitch.compiled import PUNT
from softswitch.dataplane import Dataplane
from spina.net import grow_buffers
from spina.netns import packet_socket

log = logging.getLogger("spina.softswitch.l2")

_PACKET_OUTGOING = 4
_SOL_PACKET, _PACKET_IGNORE_OUTGOING = 263, 23
# Frames a readable port may give per poll wake-up before the next port's turn. After the
# switch was descheduled every port holds a backlog; draining one port whole first would let its
# workers' next rounds overtake the others' rounds of the same slots, and the pipeline holds
# (drops) a round that runs ahead of a slot's unfinished one. Turns of one receive batch keep
# the ports within a batch of each other, well inside a job's slot window.
PORT_TURN = 32


# ---------------------------------------------------------------- raw sockets
class L2Switch:
    """The Dataplane on network interfaces. `start()` runs it in a thread; `stop()` ends it.

    Args:
        interfaces: {port number: interface name}, as BMv2's `-i 1@veth1`.
        dataplane: the pipeline to run (a new one if None).
    """

    def __init__(self, interfaces: dict[int, str], dataplane: Dataplane | None = None):
        self.dataplane = dataplane or Dataplane()
        self.socks: dict[int, socket.socket] = {}
        try:
            for port, ifname in interfaces.items():
                s = packet_socket(ifname)  # this port's frames only, none of another's
                self.socks[port] = s
                try:  # Linux >= 4.20: our own transmissions are not handed back to us
                    s.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
                except OSError:
                    pass  # older kernels: serve_forever skips them (PACKET_OUTGOING)
                grow_buffers(s)  # a burst of every worker's frames must fit while we work
                s.setblocking(False)
        except OSError:
            self.close()
            raise
        self.interfaces = dict(interfaces)
        self._by_fd = {s.fileno(): p for p, s in self.socks.items()}
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._py_in = self._py_out = 0  # frames the Python loop received and sent
        self._py_send_errors = 0  # frames it could not send
        self.punted = 0  # frames the compiled path handed to the Python pipeline
        self._fast = self.dataplane.compiled
        if self._fast is not None:
            with self.dataplane.pipeline.lock:
                self._fast.attach({p: s.fileno() for p, s in self.socks.items()})

    @property
    def frames_in(self) -> int:
        """Frames received (by the compiled path and by Python)."""
        fast = self.dataplane.compiled
        return self._py_in + (fast.stats()["frames_in"] if fast is not None else 0)

    @property
    def frames_out(self) -> int:
        fast = self.dataplane.compiled
        return self._py_out + (fast.stats()["frames_out"] if fast is not None else 0)

    @property
    def send_errors(self) -> int:
        """Frames the switch could not send (a full socket buffer, a port gone): lost."""
        fast = self.dataplane.compiled
        return self._py_send_errors + (fast.stats()["send_errors"] if fast is not None else 0)

    def serve_forever(self) -> None:
        poller = select.poll()
        for fd in self._by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        dp = self.dataplane
        buf = bytearray(65536)  # every frame lands here first
        view = memoryview(buf)
        log.info("software switch (L2) on %s",
                 ", ".join(f"{p}@{i}" for p, i in self.interfaces.items()))
        while True:
            due = dp.next_departure()  # a rate-limited port has frames waiting
            wait = None if due is None else max(0, int((due - time.monotonic()) * 1000) + 1)
            events = poller.poll(wait)
            if due is not None:
                try:
                    with dp.pipeline.lock:
                        outs = dp.departures(time.monotonic())
                except Exception:  # a bug must not take the switch down
                    log.exception("egress error on queued frames; dropped")
                    outs = []
                self._transmit(outs)
            for fd, _ in events:
                if fd == self._stop_r:
                    return
                port = self._by_fd[fd]
                if self._fast is not None and dp.queues.idle and self._serve_compiled(port):
                    continue
                sock = self.socks[port]
                recv = sock.recvfrom_into
                for _ in range(PORT_TURN):  # a port's turn, then the next readable one's
                    try:
                        n, addr = recv(buf)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as e:
                        log.debug("port %d: %s", port, e)
                        break
                    if addr[2] == _PACKET_OUTGOING:
                        continue  # our own transmission seen again (kernels before 4.20)
                    frame = bytes(view[:n])  # the frame's size, not a 64 KiB allocation
                    self._py_in += 1
                    try:
                        with dp.pipeline.lock:
                            outs = dp.process(frame, port)
                    except Exception:  # a bug must not take the switch down
                        log.exception("pipeline error on a frame from port %d; dropped", port)
                        continue
                    self._transmit(outs)

    def _serve_compiled(self, port: int) -> bool:
        """Serve `port`'s turn compiled (PORT_TURN frames, or until its socket is empty), each
        punted frame through Python's pipeline in its turn: True; False if the compiled path
        failed (Python serves from now on)."""
        dp, fast = self.dataplane, self._fast
        while True:
            try:
                with dp.pipeline.lock:
                    outcome, frame, inport = fast.serve(port, PORT_TURN)
            except Exception:  # a bug must not take the switch down
                log.exception("compiled frame path failed; the Python data path serves from now on")
                self._fast = None
                return False
            if outcome == PUNT:
                self.punted += 1
                try:
                    with dp.pipeline.lock:
                        outs = dp.process_python(frame, inport)
                except Exception:
                    log.exception("pipeline error on a frame from port %d; dropped", inport)
                    continue
                self._transmit(outs)
            else:  # idle, or its turn is over (a batch a punt cut short is finished first)
                return True

    def _transmit(self, outs: list[tuple[int, bytes]]) -> None:
        for eport, data in outs:
            out = self.socks.get(eport)
            if out is None:
                continue
            try:
                out.send(data)
                self._py_out += 1
            except OSError as e:
                log.debug("send on port %d failed: %s", eport, e)
                self._py_send_errors += 1

    def start(self) -> "L2Switch":
        self._thread = threading.Thread(target=self.serve_forever, name="spina-l2", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        if getattr(self, "_fast", None) is not None:
            with self.dataplane.pipeline.lock:
                self._fast.attach({})  # the sockets close: the compiled path forgets them
        for s in self.socks.values():
            s.close()
        self.socks.clear()
        for fd in (getattr(self, "_stop_r", None), getattr(self, "_stop_w", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._stop_r = self._stop_w = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
