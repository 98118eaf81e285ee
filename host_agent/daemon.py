"""The host agent daemon: one long-lived process per host owns the network side of SpINA.

    python -m host_agent daemon --config /etc/spina/agent.json

Training processes on the host come and go; the daemon keeps the agents (their UDP sockets
and per-slot round counters) for every (job, rank) a local process has attached to. A client
talks to it over a Unix-domain stream socket and hands tensors over in shared memory:

    client                                      daemon (one thread per connection)
    attach {job_file, rank}            ──▶      load the job file, create/reuse the Agent
                                       ◀──      {ok, job, nworkers}
    write tensor into its shm segment
    allreduce {shm, dtype, n}          ──▶      map the segment (once), Agent.allreduce on a
                                                numpy view of it, write the sum back in place
                                       ◀──      {ok, stats}
    read the sum from the segment

Messages are 4-byte big-endian lengths followed by JSON. A client that dies mid-call costs
nothing but that call: the daemon finishes the all-reduce (the other ranks need it), finds the
connection gone when it replies, drops the connection's mappings and frees the rank for the
next process. Several connections and several jobs are served at once; one (job, rank) runs
one call at a time (its agent's lock).

Config file (JSON; every field optional):
    {"socket": "/tmp/spina-agent.sock", "log_file": null, "log_level": "INFO",
     "timeout": 30.0, "rto": 0.005}
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import struct
import threading
from dataclasses import asdict, dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from host_agent.agent import Agent, CallStats, SpinaError
from host_agent.recovery import MIN_RTO
from spina.config import ConfigError, JobFile

log = logging.getLogger("spina.daemon")

DEFAULT_SOCKET = "/tmp/spina-agent.sock"
_DTYPES = {"float32": np.float32, "int32": np.int32}
_LEN = struct.Struct("!I")
MAX_MESSAGE = 1 << 20


@dataclass
class DaemonConfig:
    """The daemon's config file, validated in one place; errors name the field."""
    socket: str = DEFAULT_SOCKET
    log_file: str | None = None
    log_level: str = "INFO"
    timeout: float = 30.0
    rto: float = MIN_RTO  # the floor of the adaptive retransmission timeout (s)

    @classmethod
    def load(cls, path: str | None) -> "DaemonConfig":
        if path is None:
            return cls()
        try:
            with open(path) as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"daemon config {path}: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"daemon config {path}: top level must be an object")
        known = set(cls.__dataclass_fields__)
        for k in d:
            if k not in known:
                raise ConfigError(f"daemon config: unknown field '{k}' (known: {', '.join(sorted(known))})")
        cfg = cls(**d)
        for name in ("timeout", "rto"):
            if not isinstance(getattr(cfg, name), (int, float)) or getattr(cfg, name) <= 0:
                raise ConfigError(f"daemon config: field '{name}': must be a positive number")
        if not isinstance(cfg.socket, str) or not cfg.socket:
            raise ConfigError("daemon config: field 'socket': must be a path")
        return cfg


# ---------------------------------------------------------------------- framing
def send_msg(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_msg(sock: socket.socket) -> dict | None:
    """The next message, or None when the peer closed the connection."""
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE:
        raise ValueError(f"message of {n} bytes exceeds {MAX_MESSAGE}")
    body = _recv_exact(sock, n)
    if body is None:
        return None
    return json.loads(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _open_shm(name: str) -> shared_memory.SharedMemory:
    """Map a client's segment without adopting it: Python 3.11's resource tracker would
    otherwise unlink the client's segment when the daemon exits (and warn about a leak)."""
    shm = shared_memory.SharedMemory(name=name)
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (no public API)
    except Exception:  # pragma: no cover - tracker details differ between versions
        pass
    return shm


# ---------------------------------------------------------------------- server
class _Slot:
    """One (job, rank): its agent and the lock that serialises its calls."""

    def __init__(self, agent: Agent, jf: JobFile):
        self.agent = agent
        self.jf = jf
        self.lock = threading.Lock()


class Daemon:
    """The daemon's state; `serve_forever()` until `stop()` (SIGTERM/SIGINT in `main`)."""

    def __init__(self, cfg: DaemonConfig):
        self.cfg = cfg
        self._slots: dict[tuple[int, int, int], _Slot] = {}  # (job, epoch, rank)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.calls_in_progress = 0
        self.calls_done = 0
        self.clients_lost = 0
        if os.path.exists(cfg.socket):
            os.unlink(cfg.socket)  # a stale socket from a daemon that was killed
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(cfg.socket)
        os.chmod(cfg.socket, 0o660)
        self.server.listen(64)

    def serve_forever(self) -> None:
        log.info("daemon listening on %s (pid %d)", self.cfg.socket, os.getpid())
        self.server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            t = threading.Thread(target=self._serve_client, args=(conn,), daemon=True,
                                 name="spina-daemon-client")
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        self._shutdown()

    def stop(self) -> None:
        self._stop.set()

    def _shutdown(self) -> None:
        self.server.close()
        try:
            os.unlink(self.cfg.socket)
        except FileNotFoundError:
            pass
        for t in self._threads:
            t.join(timeout=1.0)  # calls in flight finish or time out on their own
        with self._lock:
            for s in self._slots.values():
                s.agent.close()
            self._slots.clear()
        log.info("daemon stopped: %d calls served, %d clients lost mid-call",
                 self.calls_done, self.clients_lost)

    def _slot(self, job_file: str, rank: int) -> tuple[_Slot, JobFile]:
        jf = JobFile.load(job_file)
        key = (jf.job.job, jf.job.epoch, rank)
        with self._lock:
            s = self._slots.get(key)
            if s is not None and s.jf != jf:
                # The same job id and epoch relaunched elsewhere (new switch or ports): the old
                # agent's socket and round counters belong to the old incarnation.
                log.info("job %d epoch %d rank %d: job file changed, new agent", jf.job.job,
                         jf.job.epoch, rank)
                with s.lock:
                    s.agent.close()
                s = None
            if s is None:
                agent = Agent(jf.job, rank, jf.switch, timeout=self.cfg.timeout, rto=self.cfg.rto)
                s = self._slots[key] = _Slot(agent, jf)
                log.info("job %d epoch %d rank %d: agent on %s:%d, switch %s:%d", jf.job.job,
                         jf.job.epoch, rank, *agent.sock.getsockname(), *jf.switch)
        return s, jf

    def _serve_client(self, conn: socket.socket) -> None:
        slot: _Slot | None = None
        maps: dict[str, shared_memory.SharedMemory] = {}
        peer = "client"
        try:
            while True:
                msg = recv_msg(conn)
                if msg is None:
                    return
                op = msg.get("op")
                if op == "attach":
                    try:
                        slot, jf = self._slot(str(msg["job_file"]), int(msg["rank"]))
                    except (ConfigError, OSError, KeyError, ValueError) as e:
                        send_msg(conn, {"ok": False, "error": f"attach: {e}"})
                        continue
                    peer = f"job {jf.job.job} rank {msg['rank']} (pid {msg.get('pid')})"
                    log.info("%s attached", peer)
                    send_msg(conn, {"ok": True, "job": jf.to_dict()})
                elif op == "allreduce":
                    if slot is None:
                        send_msg(conn, {"ok": False, "error": "allreduce before attach"})
                        continue
                    reply = self._allreduce(slot, msg, maps)
                    try:
                        send_msg(conn, reply)
                    except OSError:
                        self.clients_lost += 1
                        log.warning("%s went away during a call; the call completed, rank freed", peer)
                        return
                elif op == "status":
                    send_msg(conn, {"ok": True, "calls_in_progress": self.calls_in_progress,
                                    "calls_done": self.calls_done, "clients_lost": self.clients_lost,
                                    "agents": len(self._slots)})
                else:
                    send_msg(conn, {"ok": False, "error": f"unknown op {op!r}"})
        except (OSError, ValueError) as e:
            log.warning("%s: connection dropped: %s", peer, e)
        finally:
            for shm in maps.values():
                shm.close()
            conn.close()

    def _allreduce(self, slot: _Slot, msg: dict, maps: dict) -> dict:
        try:
            name, n, dtype = str(msg["shm"]), int(msg["n"]), _DTYPES[msg["dtype"]]
            shm = maps.get(name)
            if shm is None:
                for old in maps.values():  # the client moved to a new (larger) segment
                    old.close()
                maps.clear()
                shm = maps[name] = _open_shm(name)
            view = np.ndarray((n,), dtype, buffer=shm.buf)
        except (KeyError, ValueError, TypeError, FileNotFoundError) as e:
            return {"ok": False, "error": f"allreduce: bad request: {e}"}
        with slot.lock:
            self.calls_in_progress += 1
            try:
                slot.agent.allreduce(view, inplace=True)  # the sum lands in shared memory
                stats = asdict(slot.agent.last_stats)
            except SpinaError as e:
                return {"ok": False, "error": f"{type(e).__name__}: {e}"}
            finally:
                self.calls_in_progress -= 1
                self.calls_done += 1
                del view
        return {"ok": True, "stats": stats}


# ---------------------------------------------------------------------- client
class DaemonClient:
    """A training process's handle on the daemon; quacks like `Agent` for the torch hook.

    Args:
        job_file: the job file (spina.config.JobFile) of the job to join.
        rank: this process's rank in it.
        socket_path: the daemon's Unix socket.

    Example:
        >>> c = DaemonClient("/tmp/spina-job.json", rank=0)   # doctest: +SKIP
        >>> c.allreduce(np.ones(1000, np.float32))           # doctest: +SKIP
    """

    def __init__(self, job_file: str, rank: int, socket_path: str = DEFAULT_SOCKET):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(socket_path)
        send_msg(self.sock, {"op": "attach", "job_file": os.path.abspath(job_file), "rank": rank,
                             "pid": os.getpid()})
        reply = self._reply()
        self.job = JobFile.from_dict(reply["job"]).job
        self.rank = rank
        self.last_stats = CallStats()
        self._shm: shared_memory.SharedMemory | None = None
        self._executor = None

    def _reply(self) -> dict:
        reply = recv_msg(self.sock)
        if reply is None:
            raise SpinaError("the daemon closed the connection")
        if not reply.get("ok"):
            raise SpinaError(reply.get("error", "daemon error"))
        return reply

    def allreduce(self, x, inplace: bool = False):
        """Element-wise sum over the job's ranks (float32 or int32 numpy; torch via numpy).

        inplace: also write the sum into `x` (as Agent.allreduce does)."""
        is_torch = type(x).__module__.startswith("torch")
        if is_torch:
            import torch
            arr = x.detach().to(torch.int32 if x.dtype == torch.int32 else torch.float32).numpy()
        else:
            arr = np.asarray(x)
        dtype = np.dtype(np.int32) if arr.dtype == np.int32 else np.dtype(np.float32)
        n = arr.size
        nbytes = max(n * 4, 4)
        if self._shm is None or self._shm.size < nbytes:
            if self._shm is not None:
                self._shm.close()
                self._shm.unlink()
            self._shm = shared_memory.SharedMemory(create=True, size=nbytes)
        view = np.ndarray((n,), dtype, buffer=self._shm.buf)
        view[:] = arr.reshape(-1)
        send_msg(self.sock, {"op": "allreduce", "shm": self._shm.name, "n": n, "dtype": dtype.name})
        reply = self._reply()
        self.last_stats = CallStats(**reply["stats"])
        out = view.copy().reshape(arr.shape)
        del view
        if inplace and not is_torch:
            arr[...] = out
        if is_torch:
            import torch
            return torch.from_numpy(out).to(x.dtype)
        return out.astype(arr.dtype, copy=False)

    def allreduce_async(self, x, inplace: bool = False):
        if self._executor is None:
            import concurrent.futures
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spina-client")
        return self._executor.submit(self.allreduce, x, inplace)

    def status(self) -> dict:
        send_msg(self.sock, {"op": "status"})
        return self._reply()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.sock.close()
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def status(socket_path: str = DEFAULT_SOCKET) -> dict:
    """The daemon's counters, without attaching to a job."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(socket_path)
        send_msg(s, {"op": "status"})
        return recv_msg(s)


# ---------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m host_agent daemon",
        description="SpINA host agent daemon: serves all-reduce to local training processes "
                    "(Unix socket + shared memory). Stops cleanly on SIGTERM or SIGINT.")
    ap.add_argument("--config", help="JSON config file (fields: socket, log_file, log_level, "
                                     "timeout, rto)")
    ap.add_argument("--socket", help=f"Unix socket path (overrides the config; default {DEFAULT_SOCKET})")
    ap.add_argument("--log-file", help="log to this file (overrides the config; default stderr)")
    args = ap.parse_args(argv)
    cfg = DaemonConfig.load(args.config)
    if args.socket:
        cfg.socket = args.socket
    if args.log_file:
        cfg.log_file = args.log_file
    logging.basicConfig(level=cfg.log_level, filename=cfg.log_file,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    daemon = Daemon(cfg)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop())
    daemon.serve_forever()
    return 0


__all__ = ["Daemon", "DaemonClient", "DaemonConfig", "main", "status"]
