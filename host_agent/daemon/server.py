"""The daemon's server: `DaemonConfig`, `Daemon` (one thread per connection) and `main`.

    python -m host_agent daemon --config /etc/spina/agent.json

Config file (JSON; every field optional):
    {"socket": "/tmp/spina-agent.sock", "log_file": null, "log_level": "INFO",
     "log_format": "text", "timeout": 30.0, "rto": 0.005, "metrics": null,
     "bounded_loss": null, "priority_policy": null, "loss_tolerant_policy": null,
     "loss_deadline": null}
`metrics` ("[HOST:]PORT", loopback by default) serves Prometheus metrics (host_agent/metrics.py);
`bounded_loss`, `priority_policy`, `loss_tolerant_policy`, `loss_deadline` (seconds or "auto";
null: each job file's own) override the DLCP settings of every job this daemon serves
(host_agent/dlcp.py, docs/dlcp.md; 0 = exact).
`log_format` is text, kv or json (spina/log.py). Lines about a client or a call carry job, rank
(and call, client_pid) as fields.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from host_agent import dlcp
from host_agent.agent import Agent, SpinaError
from host_agent.daemon import hier
from host_agent.daemon.protocol import (
    DEFAULT_SOCKET,
    BadMessage,
    check_request,
    recv_msg,
    send_msg,
)
from host_agent.metrics import AgentMetrics
from host_agent.recovery import MIN_RTO
from spina import cli, log as spina_log
from spina.config import (
    LOSS_DEADLINE_AUTO,
    LOSS_TOLERANT_POLICIES,
    PRIORITY_POLICIES,
    ConfigError,
    JobFile,
    load_worker_file,
)
from spina.fields import checker, is_kind, read_json
from spina.metrics import parse_address

log = logging.getLogger("spina.daemon")

_DTYPES = {"float32": np.float32, "int32": np.int32}


@dataclass
class DaemonConfig:
    """The daemon's config file, validated in one place; errors name the field."""
    socket: str = DEFAULT_SOCKET
    log_file: str | None = None
    log_level: str = "INFO"
    log_format: str = spina_log.DEFAULT_FORMAT
    timeout: float = 30.0
    rto: float = MIN_RTO  # the floor of the adaptive retransmission timeout (s)
    metrics: str | None = None
    bounded_loss: float | None = None        # DLCP overrides of every job's file (None: keep)
    priority_policy: str | None = None
    loss_tolerant_policy: str | None = None
    loss_deadline: float | str | None = None  # seconds, or "auto" (spina.config)

    def job(self, job):
        """`job` (a JobConfig) with this daemon's DLCP overrides (ConfigError naming the field)."""
        return dlcp.with_policy(job, self.bounded_loss, self.priority_policy,
                                self.loss_tolerant_policy, self.loss_deadline)

    @classmethod
    def load(cls, path: str | None) -> "DaemonConfig":
        if path is None:
            return cls().validate()
        d = read_json(path, "daemon config")
        if not isinstance(d, dict):
            raise ConfigError(f"daemon config {path}: top level must be an object")
        known = set(cls.__dataclass_fields__)
        for k in d:
            if k not in known:
                raise ConfigError(f"daemon config {path}: unknown field '{k}' "
                                  f"(known: {', '.join(sorted(known))})")
        try:
            return cls(**d).validate()
        except ConfigError as e:
            raise ConfigError(f"daemon config {path}: {e}") from None

    def validate(self) -> "DaemonConfig":
        """Check every field (also after command-line overrides); errors name the field."""
        need = checker("")
        for name in ("timeout", "rto"):
            v = getattr(self, name)
            need(is_kind(v, float) and 0 < v < float("inf"),
                 name, f"must be a positive number of seconds, got {v!r}")
        need(isinstance(self.log_level, str) and self.log_level in spina_log.LEVELS, "log_level",
             f"{self.log_level!r} is not one of {', '.join(spina_log.LEVELS)}")
        need(isinstance(self.log_format, str) and self.log_format in spina_log.FORMATS,
             "log_format", f"{self.log_format!r} is not one of {', '.join(spina_log.FORMATS)}")
        need(isinstance(self.socket, str) and self.socket, "socket",
             f"must be a path, got {self.socket!r}")
        # sun_path holds 108 bytes with the terminating NUL
        need(len(os.fsencode(self.socket)) < 108, "socket",
             f"{self.socket!r} is longer than a Unix socket path may be (107 bytes)")
        need(self.log_file is None or (isinstance(self.log_file, str) and self.log_file),
             "log_file", f"must be a path or null, got {self.log_file!r}")
        for name in ("socket", "log_file"):
            path = getattr(self, name)
            if path is not None:
                folder = os.path.dirname(os.path.abspath(path))
                need(os.path.isdir(folder), name, f"directory {folder} does not exist")
        if self.metrics is not None:
            try:
                parse_address(str(self.metrics))
            except ValueError as e:
                raise ConfigError(f"field 'metrics': {e}") from None
        if self.bounded_loss is not None:
            v = self.bounded_loss
            need(is_kind(v, float) and 0 <= v < 1,
                 "bounded_loss", f"must be a fraction in [0, 1), got {v!r}")
        if self.loss_deadline is not None:
            v = self.loss_deadline
            need(v == LOSS_DEADLINE_AUTO or (is_kind(v, float)
                                             and 0 < v < float("inf")),
                 "loss_deadline", f"{v!r} is neither positive seconds nor '{LOSS_DEADLINE_AUTO}'")
        for name, allowed in (("priority_policy", PRIORITY_POLICIES),
                              ("loss_tolerant_policy", LOSS_TOLERANT_POLICIES)):
            v = getattr(self, name)
            need(v is None or (isinstance(v, str) and v in allowed), name,
                 f"{v!r} is not one of {', '.join(allowed)}")
        return self



def _open_shm(name: str) -> shared_memory.SharedMemory:
    """Map a client's segment without adopting it: Python 3.11's resource tracker would
    otherwise unlink the client's segment when the daemon exits (and warn about a leak)."""
    shm = shared_memory.SharedMemory(name=name)
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # no public API
    except Exception:  # pragma: no cover - tracker details differ between versions
        pass
    return shm


# ---------------------------------------------------------------------- server
class _Slot:
    """One (job, rank): its agent and the lock that serialises its calls."""

    def __init__(self, agent: Agent, jf: JobFile, rank: int):
        self.agent = agent
        self.jf = jf
        self.rank = rank
        self.log = spina_log.bind(log, job=jf.job.job, epoch=lambda: agent.job.epoch, rank=rank)
        self.lock = threading.Lock()
        self.local = hier.LocalGroup()  # the processes attached to this rank (local ranks)


def _same_run_owner(old: JobFile, new: JobFile) -> bool:
    """Whether a rank's agent for `old` serves `new`: the same file, or one that differs only
    in the epoch when a rendezvous gives each run its epoch (`serve` writes the current run's
    epoch into the files it owns; the agent takes its epoch from the rendezvous anyway)."""
    if new.rendezvous is not None and new.job.epoch != old.job.epoch:
        new = replace(new, job=replace(new.job, epoch=old.job.epoch))
    return old == new


def _local_fields(msg: dict) -> tuple[int, int]:
    """attach's (local_rank, local_size): (0, 1) when absent (one process is the rank)."""
    need = checker("")
    has_rank, has_size = "local_rank" in msg, "local_size" in msg
    need(has_rank or not has_size, "local_rank", "is missing (local_size is given)")
    need(has_size or not has_rank, "local_size", "is missing (local_rank is given)")
    lr, size = msg.get("local_rank", 0), msg.get("local_size", 1)
    need(size >= 1, "local_size", f"must be at least 1, got {size}")
    need(0 <= lr < size, "local_rank", f"must be in 0..{size - 1}, got {lr}")
    return lr, size


class Daemon:
    """The daemon's state; `serve_forever()` until `stop()` (SIGTERM/SIGINT in `main`)."""

    def __init__(self, cfg: DaemonConfig):
        self.cfg = cfg
        # (job, rank) -> its agent while a client is attached: the ports are the rank's, so
        # a rank has one agent at a time, whatever run (epoch) its job file names
        self._slots: dict[tuple[int, int], _Slot] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.calls_in_progress = 0
        self.calls_done = 0
        self.clients_lost = 0
        self.metrics = AgentMetrics()
        self.metrics.agents.set_function(lambda: len(self._slots))
        self.metrics.in_progress.set_function(lambda: self.calls_in_progress)
        if os.path.exists(cfg.socket):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(cfg.socket)
            except OSError:  # nobody listens: a stale socket from a daemon that was killed
                os.unlink(cfg.socket)
            else:
                raise ConfigError(f"socket {cfg.socket}: another daemon is serving it "
                                  "(stop it first, or give this one another --socket)")
            finally:
                probe.close()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(cfg.socket)
            os.chmod(cfg.socket, 0o660)
            self.server.listen(64)
        except OSError as e:
            self.server.close()
            raise ConfigError(f"socket {cfg.socket}: {e.strerror or e}") from None
        try:
            self.metrics_server = self.metrics.serve(cfg.metrics) if cfg.metrics else None
        except (ValueError, OSError) as e:
            self.server.close()
            why = getattr(e, "strerror", None) or e
            raise ConfigError(f"metrics {cfg.metrics}: {why}") from None

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
        if self.metrics_server is not None:
            self.metrics_server.stop()
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

    def _slot(self, job_file: str, rank: int, conn_id: int, local_rank: int, local_size: int,
              pid: int | None) -> tuple[_Slot, JobFile]:
        """The (job, rank)'s slot, with this connection joined as `local_rank` of it."""
        jf = load_worker_file(job_file, rank)  # a job file, or a two-level job's assignment
        key = (jf.job.job, rank)
        with self._lock:
            s = self._slots.get(key)
            if s is not None and not _same_run_owner(s.jf, jf):
                # The job relaunched elsewhere (new switch or ports), or, with no rendezvous,
                # a new epoch: the old agent's socket and round counters belong to the old
                # incarnation, and its ports are the ones the new agent needs.
                s.log.info("job file changed (attached: %s), new agent",
                           ", ".join(s.local.who()) or "none")
                with s.lock:
                    s.agent.close()
                del self._slots[key]
                s = None
            if s is None:
                agent = Agent(self.cfg.job(jf.job), rank, jf.switch, timeout=self.cfg.timeout,
                              rto=self.cfg.rto, rendezvous=jf.rendezvous)
                s = self._slots[key] = _Slot(agent, jf, rank)
                s.log.info("agent on %s:%d, switch %s:%d", *agent.sock.getsockname(), *jf.switch)
                s.local.join(conn_id, local_rank, local_size, pid)
            else:
                refused = s.local.join(conn_id, local_rank, local_size, pid)
                if refused:  # before rejoin: the attached processes' run goes on untouched
                    raise ConfigError(refused)
                # A new process on this rank is a new run: its first call joins the rendezvous
                # for a fresh epoch, so whatever the previous process left half done (a call the
                # other ranks made without it) cannot leave the ranks a call apart.
                s.agent.rejoin()
        return s, jf

    def _detach(self, slot: _Slot, conn_id: int) -> None:
        """The connection left its rank. With a rendezvous the rank's last one releases the
        agent (its socket and ports): a new process of the rank starts a new run anyway, and
        gets a new agent on those ports whatever epoch serve gave the run meanwhile. Without
        one the agent stays: its call and round counters keep the rank in step with the
        others when a new process takes the rank over (a new epoch in the file replaces it)."""
        slot.local.leave(conn_id)
        with self._lock:
            key = (slot.jf.job.job, slot.rank)
            if slot.local.members or slot.jf.rendezvous is None \
                    or self._slots.get(key) is not slot:
                return
            del self._slots[key]
            with slot.lock:
                slot.agent.close()
        slot.log.info("last client detached, agent released")

    def _serve_client(self, conn: socket.socket) -> None:
        slot: _Slot | None = None
        local_rank = 0
        maps: dict[str, shared_memory.SharedMemory] = {}
        clog = log  # lines about this connection: job, rank and pid once it attached
        try:
            while True:
                try:
                    msg = recv_msg(conn)
                    error = None if msg is None else check_request(msg)
                except BadMessage as e:
                    msg, error = {}, str(e)
                    if e.fatal:  # answer, then hang up: the framing is lost
                        clog.warning("%s; connection closed", e)
                        send_msg(conn, {"ok": False, "error": error})
                        return
                if msg is None:
                    return
                if error is not None:
                    send_msg(conn, {"ok": False, "error": error})
                    continue
                op = msg["op"]
                if op == "attach":
                    if slot is not None:
                        self._detach(slot, id(conn))
                        slot = None
                    try:
                        local_rank, local_size = _local_fields(msg)
                        slot, jf = self._slot(msg["job_file"], msg["rank"], id(conn), local_rank,
                                              local_size, msg.get("pid"))
                    except (ConfigError, OSError, ValueError) as e:
                        send_msg(conn, {"ok": False, "error": f"attach: {e}"})
                        continue
                    clog = spina_log.bind(slot.log, client_pid=msg.get("pid"))
                    if local_size > 1:
                        clog = spina_log.bind(clog, local_rank=local_rank)
                    clog.info("client attached")
                    send_msg(conn, {"ok": True, "job": jf.to_dict()})
                elif op in ("allreduce", "allgather", "reduce_scatter"):
                    if slot is None:
                        send_msg(conn, {"ok": False, "error": f"{op} before attach"})
                        continue
                    reply = self._collective(slot, local_rank, msg, maps, clog)
                    try:
                        send_msg(conn, reply)
                    except OSError:
                        self.clients_lost += 1
                        self.metrics.clients_lost.inc()
                        clog.warning("client went away during a call; the call completed, rank "
                                     "freed", call=slot.agent.call_id)
                        return
                else:  # status
                    send_msg(conn, {"ok": True, "calls_in_progress": self.calls_in_progress,
                                    "calls_done": self.calls_done,
                                    "clients_lost": self.clients_lost,
                                    "agents": len(self._slots),
                                    # local ranks whose call waits for the host's others
                                    "local_waiting": sum(len(s.local.round.requests)
                                                         for s in list(self._slots.values())),
                                    "foreign_packets": sum(s.agent.foreign_packets
                                                           for s in list(self._slots.values()))})
        except (OSError, ValueError) as e:
            clog.warning("connection dropped: %s", e)
        finally:
            if slot is not None:
                self._detach(slot, id(conn))
            for shm in maps.values():
                shm.close()
            conn.close()

    def _collective(self, slot: _Slot, local_rank: int, msg: dict, maps: dict, clog) -> dict:
        """Serve one allreduce, allgather or reduce_scatter request: as the rank's one process,
        or as one local rank of it (hier.py: the last local rank to arrive runs the host's call
        for all)."""
        req = self._request(slot, msg, maps)
        if isinstance(req, dict):  # an error reply
            return req
        try:
            if slot.local.size == 1:
                return self._call(slot, [req[0]], req, clog)
            rnd, last = slot.local.arrive(local_rank, req)
            if not last:
                return slot.local.wait(rnd, self.cfg.timeout)
            try:
                reply = hier.check_requests(rnd.requests)
                if reply is not None:
                    reply = {"ok": False, "error": reply}
                else:
                    views = [rnd.requests[lr][0] for lr in sorted(rnd.requests)]
                    reply = self._call(slot, views, rnd.requests[0], clog)
                    del views
            except Exception as e:  # a bug here must not leave the other local ranks waiting
                clog.exception("host call failed")
                reply = {"ok": False, "error": f"{msg['op']}: {type(e).__name__}: {e}"}
            rnd.finish(reply)
            rnd.requests.clear()  # its views: each connection closes its own segments later
            return reply
        finally:
            del req

    def _request(self, slot: _Slot, msg: dict, maps: dict):
        """(view of the client's segment, n, dtype name, layer, op) for an allreduce,
        allgather or reduce_scatter request, or the error reply naming the field. An
        allgather's view is the segment's bytes that the gathered shards fill (n bytes of each
        of the job's processes); a reduce_scatter's the n elements of its tensor."""
        op, name, n = msg["op"], msg["shm"], msg["n"]
        if op == "allgather":
            dtype, dname, count = np.uint8, "bytes", n * slot.agent.job.nworkers * slot.local.size
        else:
            dtype, dname = _DTYPES.get(msg["dtype"]), msg["dtype"]
            count = n
            if dtype is None:
                return {"ok": False, "error": f"{op}: field 'dtype': {msg['dtype']!r} is "
                                              f"not one of {', '.join(_DTYPES)}"}
        if n < 0:
            return {"ok": False, "error": f"{op}: field 'n': {n} is negative"}
        try:
            shm = maps.get(name)
            if shm is None:
                for old in maps.values():  # the client moved to a new (larger) segment
                    old.close()
                maps.clear()
                shm = maps[name] = _open_shm(name)
        except (OSError, ValueError) as e:
            return {"ok": False, "error": f"{op}: field 'shm': {name!r}: {e}"}
        layer = None
        if "layer_index" in msg or "layer_count" in msg:
            try:
                layer = dlcp.check_layer((msg.get("layer_index"), msg.get("layer_count")))
            except ValueError as e:
                return {"ok": False, "error": f"allreduce: field 'layer_index': {e}"}
        if count * np.dtype(dtype).itemsize > shm.size:
            what = (f"{n} {dname} elements" if op != "allgather" else
                    f"{n} bytes from each of {count // max(n, 1)} processes")
            return {"ok": False, "error": f"{op}: field 'n': {what} exceed the segment's "
                                          f"{shm.size} bytes"}
        return np.ndarray((count,), dtype, buffer=shm.buf), n, dname, layer, op

    def _call(self, slot: _Slot, views: list[np.ndarray], req: tuple, clog) -> dict:
        """The rank's agent call for its local segments `views` (one per local rank), one call
        at a time per rank. allreduce: the host sum of the views, the result in every one;
        allgather: the views' shards joined, every process's shard in every view;
        reduce_scatter: the host sum's shards, each process's at its view's start."""
        n, layer, op = req[1], req[3], req[4]
        agent = slot.agent
        with slot.lock:
            self.calls_in_progress += 1
            t0, ok = time.perf_counter(), False
            try:
                if op == "allreduce":
                    hier.host_sum(views)
                    agent.allreduce(views[0], inplace=True, layer=layer)  # the sum lands in shm
                    hier.fan_out(views)
                    st = agent.last_stats
                elif op == "reduce_scatter":
                    processes = agent.job.nworkers * len(views)
                    shard = agent.reduce_scatter(
                        hier.scatter_input(hier.host_sum(views), processes))
                    hier.scatter_out(views, shard, n, processes, slot.rank * len(views))
                    st = agent.last_stats
                else:
                    hier.gather_out(views, agent.allgather(hier.host_shard(views, n)))
                    st = agent.last_gather_stats
                stats, ok = asdict(st), True
                # one wording for every op (docs/operations.md's log lines): the unit names it
                clog.debug("call done: %d %s, %d packets sent, %d resends, %.1f ms", n,
                           "bytes gathered" if op == "allgather" else "elements",
                           stats["packets_sent"], stats["resends"],
                           1e3 * (time.perf_counter() - t0), call=agent.call_id)
                if stats.get("partial_rounds"):  # bounded loss: what this call lost, every time
                    clog.info("call completed partially: %d partial rounds, %d own blocks lost",
                              stats["partial_rounds"], stats["blocks_lost"], call=agent.call_id)
            except SpinaError as e:
                clog.warning("call failed: %s: %s", type(e).__name__, e, call=agent.call_id)
                return {"ok": False, "error": f"{type(e).__name__}: {e}"}
            finally:
                self.calls_in_progress -= 1
                self.calls_done += 1
                # a reduce-scatter runs an all-reduce's rounds (CallStats): its series counts it
                gather = op == "allgather"
                self.metrics.call_done(slot.jf.job.job, slot.rank,
                                       agent.last_gather_stats if gather else agent.last_stats,
                                       time.perf_counter() - t0, ok,
                                       op="allgather" if gather else "allreduce")
        return {"ok": True, "stats": stats}


# ---------------------------------------------------------------------- CLI
def _field(name: str, convert=str, bad: tuple[str, ...] = ()):
    """An argparse type for the option that overrides the config's field `name`: the value
    checked by DaemonConfig.validate, as the file's would be."""
    def parse(text: str):
        value = convert(text)
        DaemonConfig(**{name: value}).validate()
        return value
    return cli.parsed_by(parse, name, bad)


def parser(prog: str = "python -m host_agent daemon") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(
        prog=prog,
        description="SpINA host agent daemon: serves all-reduce, all-gather and "
                    "reduce-scatter to local training processes (Unix socket + shared "
                    "memory). Stops cleanly on SIGTERM or SIGINT.")
    ap.add_argument("--config", type=cli.input_file,
                    help="JSON config file (fields: socket, log_file, log_level, "
                         "log_format, timeout, rto, metrics, bounded_loss, "
                         "priority_policy, loss_tolerant_policy, loss_deadline)")
    ap.add_argument("--socket",
                    type=_field("socket", bad=("no-such-dir/a.sock", "/tmp/" + "s" * 120)),
                    help=f"Unix socket path (overrides the config; default {DEFAULT_SOCKET})")
    ap.add_argument("--log-file", type=_field("log_file", bad=("no-such-dir/d.log",)),
                    help="log to this file (overrides the config; default stderr)")
    spina_log.add_options(ap, level=None, fmt=None)  # None: the config's value applies
    ap.add_argument("--metrics", metavar="[HOST:]PORT", type=cli.metrics_address,
                    help="serve Prometheus metrics at http://HOST:PORT/metrics (overrides the "
                         "config; host default 127.0.0.1; a wildcard address is refused)")
    ap.add_argument("--bounded-loss", type=_field("bounded_loss", cli.finite, ("x", "1", "-0.5")),
                    metavar="FRACTION", help="DLCP: the loss bound of every job served (0 = exact; "
                                             "default: each job file's)")
    ap.add_argument("--priority-policy", choices=PRIORITY_POLICIES,
                    help="DLCP: the priority policy of every job served (default: each job "
                         "file's)")
    ap.add_argument("--loss-tolerant-policy", choices=LOSS_TOLERANT_POLICIES,
                    help="DLCP: which packets may be dropped, for every job served (default: "
                         "each job file's)")
    ap.add_argument("--loss-deadline", type=cli.seconds_or_auto, metavar="SECONDS|auto",
                    help="DLCP: how long a round may wait for a missing worker before it is "
                         "completed without it (bounded loss only): seconds, or 'auto': twice "
                         "the measured latency of the agent's rounds, at least 2 ms and at most "
                         "50 ms, so a round is given up when it is clearly late on this fabric "
                         "(default: each job file's; the job file's default is 0.05)")
    return ap


def main(argv=None, prog: str = "python -m host_agent daemon") -> int:
    ap = parser(prog)
    args = ap.parse_args(argv)
    overrides = {k: v for k, v in (("socket", args.socket), ("log_file", args.log_file),
                                   ("log_level", args.log_level), ("log_format", args.log_format),
                                   ("metrics", args.metrics),
                                   ("priority_policy", args.priority_policy),
                                   ("loss_tolerant_policy", args.loss_tolerant_policy)) if v}
    if args.bounded_loss is not None:  # 0 is a value (exact), not "unset"
        overrides["bounded_loss"] = args.bounded_loss
    if args.loss_deadline is not None:
        overrides["loss_deadline"] = args.loss_deadline
    try:
        cfg = replace(DaemonConfig.load(args.config), **overrides)
        spina_log.setup("daemon", cfg.log_level, cfg.log_format, cfg.log_file)
    except (ConfigError, OSError) as e:
        return cli.fail(ap.prog, e)
    try:
        daemon = Daemon(cfg)
    except ConfigError as e:
        return cli.fail(ap.prog, e)
    if daemon.metrics_server is not None:
        print(f"metrics {daemon.metrics_server.url}", flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop())
    daemon.serve_forever()
    return 0


__all__ = ["Daemon", "DaemonConfig", "main"]
