"""The Python side of the compiled data path (softswitch/_datapath.c): its tables, derived from
a Dataplane's, and the L2 mode's frames (`CompiledFrames`).

The compiled path serves what it has rows for and punts everything else to Python's pipeline
in arrival order, on the same registers and counters: so it gets the rows of the packets it
can serve exactly as the Python reference does (a flat job's contributions, `core_entries`),
and none of the others (leaf and spine jobs, a group it cannot replicate).
"""
from __future__ import annotations

import logging
import socket

from spina import wire

try:
    from softswitch import _datapath
except ImportError as e:  # not built: core_entries still serves the UDP mode's Python path
    _datapath, _NOT_BUILT = None, str(e)

log = logging.getLogger("spina.softswitch")

SERVE_BUDGET = 256  # packets per compiled call: the lock is free for the control plane between
IDLE, BUDGET, PUNT = 0, 1, 2  # serve()'s outcomes, both modes' (_datapath.c SERVE_*)
_IPV4_UDP = 20 + 8


def core_entries(dp, port: int, place) -> list[tuple]:
    """set_tables rows of a core Datapath: the admission rows of the flat jobs admitted on
    ingress `port` (a job with a leaf or spine role is Python's), each with its results'
    destinations place(mcast_grp) = (first, count) in the core's list (None: the group is
    not served compiled, nor is the job)."""
    out = []
    roles = dp.roles
    for (inport, src, job, rank), adm in dp.pipeline.admission.items():
        if inport != port or job in roles.leaves or job in roles.spines:
            continue
        where = place(adm.mcast_grp)
        if where is None:
            continue
        out.append((src[0], src[1], job, rank, adm.epoch, adm.slot_base, adm.nslots,
                    adm.nworkers, adm.block_size, adm.nlanes, *where))
    return out


def _result_fits(entry: tuple) -> bool:
    """A job's largest result (every lane present) fits an IPv4 packet's 16-bit length, as
    Dataplane._terminate needs (a larger one is Python's, which refuses it)."""
    block_size, nlanes = entry[8], entry[9]
    return _IPV4_UDP + wire.HEADER_LEN + 4 * nlanes * (1 + block_size) <= 0xFFFF


class CompiledFrames:
    """The L2 mode's compiled frames: `_datapath.FramePath` over one core Datapath per ingress
    port (the P4 admission key has the port; each core holds that port's rows), all on the
    Dataplane's Pipeline arrays. Tables are rebuilt whenever a table, a group or the hold
    changed (Dataplane.version, Pipeline.version); the caller holds pipeline.lock.

    Served compiled: a well-formed contribution frame to an ina_endpoint of a flat job admitted
    on its ingress port, whose group's every replica has a replication id (a replica without a
    worker_rewrite row is dropped, as the P4 egress drops it). The Dataplane runs it only while
    its traffic manager is idle (no rate-limited or shaped port, nothing queued): queues,
    priorities and departures are Python's.

    Args:
        dp: the Dataplane (L2 mode).
        batch: frames per receive system call (recvmmsg), 1.._datapath.BATCH.
    """

    def __init__(self, dp, batch: int | None = None):
        if _datapath is None:
            raise RuntimeError(f"softswitch/_datapath.c is not built here ({_NOT_BUILT}): run "
                               "make setup (or make core), or choose the python data path")
        self.dp = dp
        pipe = dp.pipeline
        self.fast = _datapath.FramePath(pipe.slot_capacity, dp.ina_udp_port,
                                        _datapath.BATCH if batch is None else batch)
        self._cores: dict = {}  # ingress port -> its rows' core
        self._fds: dict[int, int] = {}
        self._tables = None  # what the tables were built from
        self.punted = 0  # frames Dataplane.process handed to Python (serve's: the switch's)

    def attach(self, fds: dict[int, int]) -> None:
        """The switch's sockets, port -> fd ({}: none); the tables are rebuilt with them."""
        self._fds = dict(fds)
        self._tables = None

    def sync(self) -> None:
        dp, pipe = self.dp, self.dp.pipeline
        now = (dp.version, pipe.version, pipe.hold_newer_rounds)
        if now == self._tables:
            return
        replicas: list[tuple] = []
        placed: dict[int, tuple | None] = {}

        def place(grp: int) -> tuple[int, int] | None:
            if grp not in placed:
                placed[grp] = self._place_group(grp, replicas)
            return placed[grp]

        by_port = {}
        for port in sorted({k[0] for k in pipe.admission}):
            entries = [e for e in core_entries(dp, port, place) if _result_fits(e)]
            if entries:
                by_port[port] = entries
        dests = [(socket.inet_ntoa(ip.to_bytes(4, "big")), udp) for _, _, ip, udp in replicas]
        try:
            rows = []
            for port in sorted(set(by_port) | set(self._fds)):
                core = None
                if port in by_port:
                    core = self._cores.get(port)
                    if core is None:
                        core = self._cores[port] = _datapath.Datapath(
                            -1, pipe.registers, pipe.counters, pipe.pool_slots,
                            pipe.slot_capacity)
                    core.set_tables(by_port[port], dests, pipe.hold_newer_rounds)
                rows.append((port, self._fds.get(port, -1), core))
            endpoints = [int.from_bytes(a, "big") for a in dp.ina_endpoint]
            self.fast.set_tables(rows, endpoints, replicas)
        except (ValueError, TypeError, OverflowError) as e:
            log.error("compiled frames: %s; the Python pipeline serves every frame", e)
            self.fast.set_tables([(p, fd, None) for p, fd in sorted(self._fds.items())], [], [])
        self._tables = now

    def _place_group(self, grp: int, replicas: list) -> tuple[int, int] | None:
        """Append group `grp`'s result copies to `replicas`: (first, count), or None if a
        replica has replication id 0 (no rewrite: the copy keeps the reply's addresses, which
        the compiled path does not build) or the group is larger than a job can be."""
        dp = self.dp
        members = dp.mcast_groups.get(grp, ())
        if len(members) > wire.MAX_WORKERS or any(rid == 0 for _, rid in members):
            return None
        first = len(replicas)
        for port, rid in members:
            rw = dp.worker_rewrite.get(rid)
            if rw is not None:  # P4: a replica without a rewrite is dropped
                mac, ip, udp = rw
                replicas.append((port, mac, int.from_bytes(ip, "big"), udp))
        return first, len(replicas) - first

    def process(self, frame, port: int) -> list[tuple[int, bytes]] | None:
        """Dataplane.process's compiled part: the frames out, or None (punted: Python's)."""
        self.sync()
        out = self.fast.process(frame, port)
        if out is None:
            self.punted += 1
        return out

    def serve(self, port: int, budget: int = SERVE_BUDGET) -> tuple[int, bytes | None, int | None]:
        """_datapath.FramePath.serve on `port`'s socket, tables synced first."""
        self.sync()
        return self.fast.serve(port, budget)

    def stats(self) -> dict[str, int]:
        return self.fast.stats()
