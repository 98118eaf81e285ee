"""Run rendezvous: every run of a job gets an epoch of its own, so a result can only belong to
the run that asked for it.

A *run* is one set of worker processes (one per rank) using a job. Agents start their call ids
and round tags at zero in every process, so without a run identity the second program on the
same switch would send round 1 of slot 0 again and the switch would answer it with the first
program's stored sum. The owner of the job's switch state (the launcher, or the controller's
`serve` command) runs a `RendezvousServer`; the job file names it. Before its first call an
agent joins: when every rank of the job has joined, the server starts a new run: it re-admits
the job at the switch with the next epoch (`on_new_run`, which also clears the job's slots) and
only then answers every rank with that epoch. Packets of the earlier run carry the old epoch
and are dropped by the switch as stale; results of the new run carry the new one.

Protocol: TCP, one JSON object per line.
    agent  -> server  {"op": "join", "job": J, "rank": R, "nworkers": N, "switch": "H:P"}
    server -> agent   {"waiting": [ranks joined so far]}    (zero or more, as ranks arrive)
    server -> agent   {"ok": true, "epoch": E}  or  {"ok": false, "error": "..."}
    anyone -> server  {"op": "hello"}
    server -> anyone  {"ok": true, "rendezvous": {"owner": "controller", "pid": P,
                       "source": FILE or null, "jobs": {"J": N, ...}}}
"switch" (optional) is the switch the agent's file names: a rendezvous that knows its jobs'
switches refuses a join naming another (the same job id and size in another deployment).
`hello` says whose rendezvous this is: a second deployment on the machine (another `serve` on
the default address) is then named, not taken for ours: by a `serve` that cannot bind the
address, by a join it refuses, and by `spina doctor`.

A rank that joins again before the others have (its process restarted) replaces its earlier
join. A join of a job whose run is under way starts the next run: the ranks still in the old
run find their packets stale and fail with a timeout, never with another run's sums.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import socketserver
import threading
import time
from typing import Callable

from spina import owner as owners

log = logging.getLogger("spina.rendezvous")

EPOCH_MOD = 1 << 16  # the wire's epoch field
# Where `controller serve` takes joins when the desired state names no rendezvous.
DEFAULT_ADDRESS = ("127.0.0.1", 47100)


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch` on the 16-bit wire field (0 is skipped: a fresh slot's value)."""
    return epoch % (EPOCH_MOD - 1) + 1


class RendezvousError(RuntimeError):
    """A join that failed; the message says why, `missing` lists ranks that never joined."""

    def __init__(self, msg: str, missing: list[int] | None = None):
        super().__init__(msg)
        self.missing = missing or []


class _Job:
    def __init__(self, nworkers: int, epoch: int):
        self.nworkers = nworkers
        self.epoch = epoch
        self.waiting: dict[int, "_Handler"] = {}  # rank -> its connection, until the run starts


class RendezvousServer:
    """Starts a run of a job when all its ranks have joined.

    Args:
        host: address to listen on (a worker address of the deployment; loopback locally).
        port: TCP port (0: any free one; `address` says which).
        jobs: {job id: (nworkers, current epoch)} of the jobs it serves.
        on_new_run: called as on_new_run(job, epoch) before the ranks are told the epoch; it
            must make the switch admit the job with that epoch and clear its slots. An
            exception fails the join at every rank with its message.
        owner: who runs it ("controller", "launcher", ...) and `source`, the file it serves
            (a desired state, a job file): what `hello` answers, so that another deployment
            beside it can name it.
        switches: {job id: the switches ("HOST:PORT") its agents send to}, if known: a join
            whose file names another switch is another deployment's, and is refused.

    Raises owner.AddressInUse naming the other rendezvous (or process) holding the address.
    """

    def __init__(self, host: str, port: int, jobs: dict[int, tuple[int, int]],
                 on_new_run: Callable[[int, int], None], owner: str = "program",
                 source: str | None = None, switches: dict[int, set[str]] | None = None):
        self.jobs = {j: _Job(n, e) for j, (n, e) in jobs.items()}
        self.on_new_run = on_new_run
        self.owner, self.source = owner, source
        self.switches = dict(switches or {})
        self.runs_started = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(_Handler):
            server_ref = outer

        self._server = socketserver.ThreadingTCPServer((host, port), Handler,
                                                       bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        try:
            self._server.server_bind()
            self._server.server_activate()
        except OSError as e:
            self._server.server_close()
            if e.errno != errno.EADDRINUSE:
                raise
            raise owners.AddressInUse(held(host, port)) from None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    def epoch(self, job: int) -> int:
        return self.jobs[job].epoch

    def set_jobs(self, jobs: dict[int, tuple[int, int]],
                 switches: dict[int, set[str]] | None = None) -> None:
        """Serve exactly `jobs` ({job: (nworkers, epoch)}) from now on: new ones are added,
        gone ones dropped (their waiting ranks are told); a kept job keeps its current epoch
        unless its worker count changed. `switches`, if given, replaces the jobs' switches."""
        with self._lock:
            if switches is not None:
                self.switches = dict(switches)
            for j in list(self.jobs):
                if j not in jobs or jobs[j][0] != self.jobs[j].nworkers:
                    for w in self.jobs.pop(j).waiting.values():
                        w.reply({"ok": False, "error": f"join: job {j} was removed or changed"})
            for j, (n, e) in jobs.items():
                if j not in self.jobs:
                    self.jobs[j] = _Job(n, e)

    def start(self) -> "RendezvousServer":
        """Serve in a thread; a second start is a no-op (never two serving threads)."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2}, daemon=True,
                                        name="spina-rendezvous")
        self._thread.start()
        log.info("run rendezvous on %s:%d", *self.address)
        return self

    def stop(self) -> None:
        """Stop serving, close the port and the joins still waiting; safe before start and
        twice (socketserver's shutdown() waits forever for a serve_forever that never ran)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=2)
            self._thread = None
        self._server.server_close()
        with self._lock:  # waiting joins end as at the process's exit: their ranks join again
            for job in self.jobs.values():
                for h in job.waiting.values():
                    h.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def hello(self) -> dict:
        """Who this rendezvous is (the `hello` reply's "rendezvous")."""
        with self._lock:
            return self._hello()

    def _hello(self) -> dict:  # under self._lock
        jobs = {str(j): job.nworkers for j, job in sorted(self.jobs.items())}
        return {"owner": self.owner, "pid": os.getpid(), "source": self.source, "jobs": jobs}

    # ------------------------------------------------------------ joins
    def _join(self, h: "_Handler", msg: dict) -> None:
        job_id, rank, nworkers = msg.get("job"), msg.get("rank"), msg.get("nworkers")
        for name, v in (("job", job_id), ("rank", rank), ("nworkers", nworkers)):
            if not isinstance(v, int) or isinstance(v, bool):
                h.reply({"ok": False, "error": f"join: field '{name}' must be an integer"})
                return
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                h.reply({"ok": False, "error": f"join: job {job_id} is not served here "
                                               f"(jobs: {sorted(self.jobs)}): this is "
                                               f"{describe(self._hello())}"})
                return
            if nworkers != job.nworkers:
                h.reply({"ok": False, "error": f"join: job {job_id} has {job.nworkers} workers, "
                                               f"the agent's job file says {nworkers}: this "
                                               f"is {describe(self._hello())}"})
                return
            switch = msg.get("switch")
            if isinstance(switch, str) and switch not in self.switches.get(job_id, {switch}):
                h.reply({"ok": False, "error": f"join: job {job_id} aggregates at "
                                               f"{', '.join(sorted(self.switches[job_id]))} "
                                               f"here, the agent's file names {switch}: this is "
                                               f"{describe(self._hello())}"})
                return
            if not 0 <= rank < job.nworkers:
                h.reply({"ok": False, "error": f"join: rank {rank} outside 0..{job.nworkers - 1}"})
                return
            old = job.waiting.get(rank)
            if old is not None and old is not h:
                old.reply({"ok": False, "error": f"join: rank {rank} of job {job_id} joined again "
                                                 "from another process"})
            job.waiting[rank] = h
            if len(job.waiting) < job.nworkers:
                joined = sorted(job.waiting)
                for w in job.waiting.values():
                    w.reply({"waiting": joined})
                return
            epoch = next_epoch(job.epoch)
            waiting, job.waiting = job.waiting, {}
            try:
                self.on_new_run(job_id, epoch)
            except Exception as e:  # every rank must hear why
                log.error("job %d: could not start run with epoch %d: %s", job_id, epoch, e)
                for w in waiting.values():
                    w.reply({"ok": False,
                             "error": f"join: the switch could not start the run: {e}"})
                return
            job.epoch = epoch
            self.runs_started += 1
        log.info("job %d: all %d ranks joined, run with epoch %d", job_id, job.nworkers, epoch)
        for w in waiting.values():
            w.reply({"ok": True, "epoch": epoch})

    def _leave(self, h: "_Handler") -> None:
        """A connection closed before its run started: its rank has not joined after all."""
        with self._lock:
            for job in self.jobs.values():
                for r, w in list(job.waiting.items()):
                    if w is h:
                        del job.waiting[r]


class _Handler(socketserver.StreamRequestHandler):
    server_ref: RendezvousServer
    timeout = 3600  # a join may wait long for the other ranks; the client sets its own limit

    def setup(self):
        super().setup()
        self._wlock = threading.Lock()

    def reply(self, obj: dict) -> None:
        try:
            with self._wlock:
                self.wfile.write((json.dumps(obj) + "\n").encode())
                self.wfile.flush()
        except (OSError, ValueError):  # ValueError: the handler closed its file already
            pass  # the agent went away; its rank is dropped when the read side sees it

    def close(self) -> None:
        """End the connection: the agent sees it closed (its handler then drops the rank)."""
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def handle(self):
        try:
            for line in self.rfile:
                if len(line) > 4096:
                    self.reply({"ok": False, "error": "join: request too long"})
                    return
                try:
                    msg = json.loads(line)
                except (ValueError, UnicodeDecodeError):
                    self.reply({"ok": False, "error": "join: request is not JSON"})
                    return
                if isinstance(msg, dict) and msg.get("op") == "hello":
                    self.reply({"ok": True, "rendezvous": self.server_ref.hello()})
                    continue
                if not isinstance(msg, dict) or msg.get("op") != "join":
                    self.reply({"ok": False, "error": "join: expected {\"op\": \"join\", ...}"})
                    return
                self.server_ref._join(self, msg)
        except OSError:
            pass
        finally:
            self.server_ref._leave(self)


def join(address: tuple[str, int], job: int, rank: int, nworkers: int, timeout: float,
         switch: tuple[str, int] | None = None) -> int:
    """Join the next run of `job` as `rank`; the run's epoch once every rank has joined.
    `switch`: the switch the agent's file names (another deployment's rendezvous refuses it).

    A connection the server closes before the run started (its `serve` restarted, say) is
    joined again, once it listens, until `timeout`: the server forgot the rank's join with that
    connection, so the rank joins afresh and no run can start without it.

    Raises RendezvousError naming the ranks that had not joined within `timeout` seconds, or
    the server's reason for refusing.
    """
    host, port = address
    deadline = time.monotonic() + timeout
    joined: list[int] = []  # the ranks the server last said had joined (kept past a timeout)
    closed = 0  # connections the server closed before the run started
    while True:
        try:
            sock = socket.create_connection(
                (host, port), timeout=max(min(deadline - time.monotonic(), 10.0), 0.1))
        except OSError as e:
            if closed:
                raise RendezvousError(f"run rendezvous {host}:{port} closed the connection "
                                      f"before job {job}'s run started and no longer takes "
                                      f"joins ({e})") from None
            raise RendezvousError(
                f"run rendezvous {host}:{port} of job {job}: cannot connect ({e}); start the "
                "job's owner first: `spina serve -c FILE` for a controller's deployment "
                "(deploy alone starts no runs), the launcher for its job file") from None
        with sock:
            got = _await_run(sock, job, rank, nworkers, deadline, joined, switch)
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            break
        closed += 1
        if time.monotonic() >= deadline:
            break
        log.warning("run rendezvous %s:%d closed rank %d's join of job %d before its run "
                    "started; joining again", host, port, rank, job)
        time.sleep(0.1)
    missing = [r for r in range(nworkers) if r not in joined and r != rank]
    raise RendezvousError(f"job {job}: ranks {missing} did not join the run within {timeout:g} s "
                          f"(rendezvous {host}:{port})", missing)


def _await_run(sock: socket.socket, job: int, rank: int, nworkers: int,
               deadline: float, joined: list[int],
               switch: tuple[str, int] | None = None) -> int | None:
    """One connection's join: the run's epoch, or None when the server closed the connection
    first or the deadline passed. `joined` is kept as the ranks the server last said had
    joined: a timeout names the others, not every rank but this one."""
    host, port = sock.getpeername()[:2]
    msg = {"op": "join", "job": job, "rank": rank, "nworkers": nworkers}
    if switch is not None:
        msg["switch"] = f"{switch[0]}:{switch[1]}"
    sock.sendall((json.dumps(msg) + "\n").encode())
    f = sock.makefile("rb")
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            line = f.readline()
        except (socket.timeout, TimeoutError, ConnectionResetError):
            return None
        except OSError as e:
            raise RendezvousError(f"run rendezvous {host}:{port}: {e}") from None
        if not line:
            return None
        msg = json.loads(line)
        if "waiting" in msg:
            joined[:] = msg["waiting"]
            continue
        if not msg.get("ok"):
            raise RendezvousError(msg.get("error", "join refused"))
        return int(msg["epoch"])


def probe(address: tuple[str, int], timeout: float = 2.0) -> dict | None:
    """What the rendezvous at `address` says of itself (`hello`: owner, pid, source, jobs),
    or None when nothing there answers as a SpINA rendezvous. OSError when nothing listens."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(b'{"op": "hello"}\n')
        try:
            line = sock.makefile("rb").readline(4096)
            reply = json.loads(line)
        except (OSError, ValueError):
            return None
    info = reply.get("rendezvous") if isinstance(reply, dict) else None
    return info if isinstance(info, dict) else None


def describe(info: dict) -> str:
    """'the rendezvous of a controller (jobs [1], pid N, file F)'."""
    jobs = sorted(int(j) for j in info.get("jobs", {}))
    source = f", file {info['source']}" if info.get("source") else ""
    return (f"the rendezvous of a {info.get('owner', 'program')} (jobs {jobs}, "
            f"pid {info.get('pid')}{source})")


def held(host: str, port: int) -> str:
    """Why (host, port) cannot be our rendezvous: the SpINA rendezvous there, named, or the
    process holding it (spina.owner)."""
    try:
        info = probe((host, port))
    except OSError:
        info = None
    if info is not None:
        return f"{host}:{port} is {describe(info).replace(' a ', ' another ', 1)}"
    return owners.in_use("tcp", host, port, "rendezvous")


__all__ = ["RendezvousServer", "RendezvousError", "join", "next_epoch", "probe", "held", "describe"]
