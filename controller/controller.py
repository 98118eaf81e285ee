"""The controller: turns the desired state (controller/state.py) into switch state over
P4Runtime, the same way for the software switch, BMv2 and Tofino (Tofino: unverified on a switch),
or for a Tofino with `api: bfrt` over the SDE's BF Runtime (controller/bfrt.py: the same
entities, translated).

`Controller(state).deploy()` is idempotent: it pushes the pipeline only when the switch's cookie
differs, diffs every table and multicast group with what the switch holds and writes only the
difference, clears the slot registers of jobs that left or (re)arrived, and writes one agent
file per worker. After a switch restart the same call restores everything.
"""
from __future__ import annotations

import hashlib
import logging
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from p4.v1 import p4runtime_pb2 as pb

from controller import controls
from controller.p4rt import Connection, NotPrimaryError, P4RuntimeError, wait_listening
from controller.registers import RegisterAdapter, adapter_for
from controller.state import DesiredState, Switch, from_l2_config
from spina import spec
from spina.config import Assignment, ConfigError, JobFile, job_to_dict, write_if_changed
from spina.rendezvous import RendezvousServer

log = logging.getLogger("spina.controller")

JOB_COUNTERS = spec.JOB_COUNTERS


def read_p4info(path: pathlib.Path, target: str, where: str):
    """The P4Info in `path` (text, or binary for .bin / .pb); ConfigError naming `where` (e.g.
    "switch s1: field") and the file when it is missing or is not a P4Info."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    if not path.exists():
        raise ConfigError(f"{where} 'p4info': {path} does not exist ({_built_by(target)})")
    info = p4info_pb2.P4Info()
    try:
        if path.suffix in (".bin", ".pb"):
            info.ParseFromString(path.read_bytes())
        else:
            text_format.Parse(path.read_text(), info, allow_unknown_field=True)
    except (text_format.ParseError, ValueError) as e:
        hint = (": a TNA P4Info with Tofino-specific externs does not parse here; compile "
                "with bf-p4c --p4runtime-force-std-externs" if target == "tofino" else "")
        raise ConfigError(f"{where} 'p4info': {path}: not a P4Info "
                          f"({str(e).splitlines()[0]}){hint}") from None
    return info


def _built_by(target: str) -> str:
    return ("make tofino writes the P4Info to tofino/build/ and bf-p4c's output directory to "
            "TNA_WORK/p4runtime" if target == "tofino" else
            "make p4 writes it where p4c-bm2-ss is installed")


def load_pipeline(state: DesiredState, sw: Switch):
    """(P4Info, device config bytes) for `sw`: its files, or the software switch's spec. A
    tofino switch's device config is built from bf-p4c's output directory
    (controller/tofino.py) in its `device_config_format`; its program must have what the
    switch's jobs need (a bounded-loss job: the hold of a newer round)."""
    if sw.p4info is None:
        return spec.p4info(), b""
    path = state.resolve(sw.p4info)
    where = f"switch {sw.name}: field"
    device_config = state.resolve(sw.device_config)
    for what, p in (("p4info", path), ("device_config", device_config)):
        if p is not None and not p.exists():
            raise ConfigError(f"{where} '{what}': {p} does not exist ({_built_by(sw.target)})")
    info = read_p4info(path, sw.target, where)
    if sw.target == "tofino":
        from controller import tofino
        tofino_externs = sorted({x.extern_type_name for x in info.externs
                                 if x.extern_type_name in ("Register", "Counter")})
        if tofino_externs:
            raise ConfigError(f"{where} 'p4info': {path} declares {' and '.join(tofino_externs)}"
                              " as Tofino externs, which P4Runtime servers do not serve: "
                              "compile with bf-p4c --p4runtime-force-std-externs")
        compiled = tofino.lane_bits(info)
        if compiled is not None and compiled != sw.lane_bits:
            raise ConfigError(f"{where} 'lane_bits': {sw.lane_bits}, but {path} is the TNA "
                              f"program compiled for {compiled}-bit lanes (its pair registers' "
                              "halves; tofino/size.p4 SPINA_LANE_BITS)")
        for job in state.jobs_on(sw):
            if job.bounded_loss and not tofino.has_hold(info):
                raise ConfigError(
                    f"job {job.id}: field 'bounded_loss': {job.bounded_loss}, but switch "
                    f"{sw.name}'s TNA program ({path}) has no hold of a newer round (no "
                    f"{tofino.HOLD_REGISTER} register): {tofino.NO_HOLD}")
        try:
            fmt = sw.device_config_format if sw.api == "p4runtime" else "bfrt"
            cfg = tofino.device_config(device_config, fmt)
        except ConfigError as e:
            raise ConfigError(f"{where} 'device_config': {e}") from None
        return info, cfg
    cfg = device_config.read_bytes() if sw.device_config else b""
    return info, cfg


def cookie_of(p4info, device_config: bytes) -> int:
    """A 64-bit cookie naming a pipeline, so `deploy` pushes it only when it changed."""
    h = hashlib.sha256(p4info.SerializeToString(deterministic=True) + device_config).digest()
    return int.from_bytes(h[:8], "big") >> 1


@dataclass
class Report:
    """What one deploy (or job change) did on one switch."""
    switch: str
    pipeline_pushed: bool = False
    inserts: int = 0
    modifies: int = 0
    deletes: int = 0
    cleared: list = field(default_factory=list)   # [(job, slot_base, nslots)]
    agent_files: int = 0          # agent files written (new or changed)
    agent_files_removed: int = 0  # stale ones deleted (a job or worker that left)

    @property
    def changed(self) -> bool:
        return bool(self.pipeline_pushed or self.inserts or self.modifies or self.deletes
                    or self.cleared or self.agent_files or self.agent_files_removed)

    def __str__(self):
        parts = [f"switch {self.switch}:"]
        parts.append("pipeline pushed," if self.pipeline_pushed else "pipeline current,")
        parts.append(f"{self.inserts} inserted, {self.modifies} modified, "
                     f"{self.deletes} deleted")
        if self.cleared:
            parts.append("; slots cleared: " + ", ".join(
                f"job {j} {b}..{b + n - 1}" for j, b, n in self.cleared))
        files = [f"{n} {what}" for n, what in ((self.agent_files, "written"),
                                                (self.agent_files_removed, "removed")) if n]
        if files:
            parts.append(f"; agent files: {', '.join(files)}")
        return " ".join(parts)


class SwitchSession:
    """One P4Runtime session with one switch and the controls that program it.

    Args:
        sw: the switch as the desired state describes it.
        election: our election id (the highest among controllers is primary).
        registers: register adapter (default: by the switch's target).
        conn: the connection to use (default: P4Runtime over gRPC to `sw.grpc`).
    """

    def __init__(self, sw: Switch, election: int | None = 1,
                 registers: RegisterAdapter | None = None,
                 timeout: float = 10.0, conn: Connection | None = None):
        self.sw = sw
        self.conn = conn or Connection(sw.grpc, sw.device_id, election, timeout)
        self.registers = registers or adapter_for(sw.target, self.conn, sw.thrift_port)
        c = self.conn
        self.ina_endpoint = controls.InaEndpoint(c)
        self.ina_check = controls.InaCheck(c)
        self.admission = controls.Admission(c)
        self.fabric_roles = controls.FabricRoles(c)
        self.aggregator = controls.Aggregator(c, self.registers)
        self.forwarding = controls.Forwarding(c)
        self.congestion = controls.CongestionDrop(c)
        self.worker_rewrite = controls.WorkerRewrite(c)
        self.replication = controls.Replication(c)

    @property
    def controls(self) -> list[controls.Control]:
        """In the order traffic meets them, for deletes; writes go in reverse order, so that a
        job's groups, rewrites and fabric roles exist before its admission lets packets in."""
        return [self.admission, self.fabric_roles, self.ina_endpoint, self.worker_rewrite,
                self.replication, self.forwarding, self.congestion]

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------ pipeline
    def ensure_pipeline(self, state: DesiredState) -> bool:
        """Push the pipeline unless the switch already runs it (same cookie). True if pushed."""
        info, cfg = load_pipeline(state, self.sw)
        cookie = cookie_of(info, cfg)
        cur = self.conn.get_pipeline()
        if cur is not None and cur.HasField("cookie") and cur.cookie.cookie == cookie:
            self.conn.use_pipeline(cur.p4info if cur.p4info.tables else info)
            return False
        self.conn.require_primary()
        self.conn.set_pipeline(info, cfg, cookie)
        log.info("%s: pipeline pushed (cookie %x)", self.sw.name, cookie)
        return True

    def attach(self) -> bool:
        """Use the pipeline the switch runs (no push). False if it runs none."""
        if self.conn.index is not None:
            return True
        cur = self.conn.get_pipeline()
        if cur is None or not cur.p4info.tables:
            return False
        self.conn.use_pipeline(cur.p4info)
        return True

    # ------------------------------------------------------------ state
    def apply(self, state: DesiredState) -> Report:
        """Make this switch hold exactly `state` (idempotent)."""
        rep = Report(self.sw.name)
        self.conn.require_primary()
        rep.pipeline_pushed = self.ensure_pipeline(state)
        before = self.admission.installed_jobs()
        want = controls.job_rows(state, self.sw).jobs  # flat jobs, and this switch's share
        deletes, writes = [], []
        for c in self.controls:
            d, w = c.diff(state, self.sw)
            deletes += d
            writes = w + writes
        # Deletes first (admission first: traffic of a leaving job stops before its slots are
        # cleared), then the slot clears, then the writes (admission last). A job that stays
        # where it is with a new epoch (a new run) is cleared after the writes instead: until
        # the new epoch is admitted, packets of the old one still pass and could refill a slot
        # cleared before, leaving round tags the new run would take for newer than its own.
        self.conn.write(deletes)
        renewed = {job for job, (base, n, epoch) in want.items()
                   if job in before and before[job][:2] == (base, n) and before[job][2] != epoch}
        for job, (base, n, epoch) in sorted(before.items()):
            if want.get(job) != (base, n, epoch) and job not in renewed:  # gone or moved
                self.aggregator.clear_slots(base, n)
                rep.cleared.append((job, base, n))
        for job, (base, n, epoch) in sorted(want.items()):
            if before.get(job) != (base, n, epoch) and job not in renewed:  # arriving
                self.aggregator.clear_slots(base, n)
                rep.cleared.append((job, base, n))
        self.conn.write(writes)
        for job in sorted(renewed):
            base, n, _ = want[job]
            self.aggregator.clear_slots(base, n)
            rep.cleared.append((job, base, n))
        rep.deletes = len(deletes)
        rep.inserts = sum(1 for t, _ in writes if t == pb.Update.INSERT)
        rep.modifies = sum(1 for t, _ in writes if t == pb.Update.MODIFY)
        return rep

    def wipe(self) -> int:
        """Every control clears its own state: entries, groups, every slot register (all
        cells, the pool and beyond). The pipeline stays; `deploy` puts the desired state back.
        Returns deletes sent."""
        self.conn.require_primary()
        deletes = [u for c in self.controls for u in c.clear()]
        self.conn.write(deletes)
        self.aggregator.clear_all()
        return len(deletes)

    def clear_job(self, job_id: int, slot_base: int, nslots: int) -> None:
        """Zero a job's slot registers and its counters (the `reset` command)."""
        self.conn.require_primary()
        self.aggregator.clear_slots(slot_base, nslots)
        ups = []
        for name in JOB_COUNTERS:
            if self.conn.index.has("counters", name):
                e = pb.Entity()
                e.counter_entry.counter_id = self.conn.index.id("counters", name)
                e.counter_entry.index.index = job_id
                e.counter_entry.data.packet_count = 0
                ups.append((pb.Update.MODIFY, e))
        self.conn.write(ups)

    def job_counters(self, job_ids) -> dict[int, dict[str, int]]:
        out = {j: {} for j in job_ids}
        for c in (self.aggregator, self.worker_rewrite, self.congestion):
            for name, vals in c.read_counters(list(job_ids)).items():
                for j, v in vals.items():
                    out[j][name] = v
        return out


class Controller:
    """Drives every switch of a desired state. Instantiate as many as you like (tests run
    several against one switch to exercise arbitration).

    Args:
        state: the desired state (controller.state.load).
        election: our election id; None: read only (status), never contesting primary.
        registers: {switch name: RegisterAdapter} overrides (tests).
        connect: opens the Connection to a switch (default: gRPC to its `grpc` address); the
            software switch run standalone passes `Connection.in_process` on its own servicer.
    """

    def __init__(self, state: DesiredState, election: int | None = 1,
                 registers: dict[str, RegisterAdapter] | None = None, timeout: float = 10.0,
                 connect: Callable[[Switch], Connection] | None = None):
        self.state = state
        self.election = election
        self.timeout = timeout
        self._registers = registers or {}
        self._connect = connect
        self.sessions: dict[str, SwitchSession] = {}
        self.lock = threading.Lock()  # `serve`: a run's start and a reconcile never interleave

    def session(self, name: str) -> SwitchSession:
        s = self.sessions.get(name)
        if s is None:
            sw = self.state.switches[name]
            conn = self._connect(sw) if self._connect else None
            if conn is None and sw.api == "bfrt":
                conn = self._bfrt_connection(sw)
            s = SwitchSession(sw, self.election, self._registers.get(name), self.timeout, conn)
            self.sessions[name] = s
        return s

    def _bfrt_connection(self, sw: Switch):
        """A BF Runtime session (controller/bfrt.py) for a tofino switch with `api: bfrt`: it
        binds to the program the switch's files name, and translates the controls' entities."""
        from controller.bfrt import BfrtConnection
        info, cfg = load_pipeline(self.state, sw)
        try:
            return BfrtConnection(sw.grpc, sw.device_id, self.election, self.timeout,
                                  p4info=info, device_config=cfg)
        except ConfigError as e:  # the SDE's modules are missing
            raise ConfigError(f"switch {sw.name}: field 'api': bfrt: {e}") from None

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ commands
    def deploy(self, switches: list[str] | None = None, agent_files: bool = True) -> list[Report]:
        """Make the switches hold the desired state and (unless `agent_files` is False: a
        software switch programming itself) write the agents' files."""
        reports = []
        for name in switches or list(self.state.switches):
            reports.append(self.session(name).apply(self.state))
        if agent_files:
            n, gone = self.write_agent_files()
            if reports:
                reports[0].agent_files, reports[0].agent_files_removed = n, gone
        return reports

    def adopt(self, state: DesiredState) -> None:
        """Take a new desired state; sessions of switches that left it (or moved) are closed."""
        self.state = state
        for name, s in list(self.sessions.items()):
            sw = state.switches.get(name)
            if sw is None or (sw.grpc, sw.device_id) != (s.sw.grpc, s.sw.device_id):
                s.close()
                del self.sessions[name]
            else:
                s.sw = sw

    def set_state(self, state: DesiredState) -> list[Report]:
        """Adopt a new desired state (job add/remove) and apply it."""
        self.adopt(state)
        return self.deploy()

    def start_run(self, job_id: int, epoch: int) -> list[Report]:
        """Admit job `job_id` with `epoch` on every switch that holds it and clear its slots
        there: a new run (`serve`'s rendezvous calls this once every rank has joined). A
        fabric job's spines first, so that no new-epoch partial meets a spine of the old."""
        self.state = self.state.with_epoch(job_id, epoch)
        reports = []
        for name in self.state.job_switches(job_id):
            try:
                reports.append(self.session(name).apply(self.state))
            except NotPrimaryError:
                raise  # another controller writes: never fight it
            except (P4RuntimeError, OSError, ValueError) as e:
                # The switch restarted since this session was opened (its stream is gone, or
                # its channel closed; ValueError is gRPC's closed channel), or is restarting
                # (refused): once its port listens, a new session, which restores the switch's
                # whole state with the run's epoch.
                reports.append(self._reconnect_and_apply(name, e))
        return reports

    def _reconnect_and_apply(self, name: str, why: Exception) -> Report:
        """A new session to switch `name`, which restores its whole state, retried until
        `timeout`: a switch that has just restarted may listen and still close a channel or
        two while it starts (seen once in CI as 'CANCELLED: Channel closed!')."""
        deadline = time.monotonic() + self.timeout
        while True:
            log.info("switch %s: %s; reconnecting", name, why)
            old = self.sessions.pop(name, None)
            if old is not None:
                old.close()
            wait_listening(self.state.switches[name].grpc, max(deadline - time.monotonic(), 0.1))
            try:
                return self.session(name).apply(self.state)
            except NotPrimaryError:
                raise
            except (P4RuntimeError, OSError, ValueError) as e:
                if time.monotonic() >= deadline:
                    raise
                why = e
                time.sleep(0.1)

    def runs(self, report: Callable[[str], None] | None = None) -> RendezvousServer:
        """The run rendezvous of this state's jobs, flat and fabric (not started), at the
        state's `rendezvous`: each run's epoch comes from `start_run`, whose reports go to
        `report` (default: the log). `serve` runs it; so can any program that owns the runs."""
        report = report or log.info

        def new_run(job: int, epoch: int) -> None:
            with self.lock:
                for r in self.start_run(job, epoch):
                    report(f"{r} (job {job}: run with epoch {epoch})")
        path = self.state.path
        return RendezvousServer(*self.state.rendezvous, self.state.run_jobs(), new_run,
                                owner="controller", source=str(path.resolve()) if path else None,
                                switches=run_switches(self.state))

    def reset(self, job_ids=None) -> list[tuple[int, int, int]]:
        """Clear the slot registers and zero the counters of jobs (default: all), on every
        switch that holds them."""
        out = []
        known = self.state.run_jobs()
        for jid in sorted(job_ids or known):
            if jid not in known:
                raise ConfigError(f"job {jid}: not in the desired state")
            for name in self.state.job_switches(jid):
                s = self.session(name)
                if not s.attach():
                    raise ConfigError(f"switch {s.sw.name} runs no pipeline: deploy first")
                base, n, _ = controls.job_rows(self.state, s.sw).jobs[jid]
                s.clear_job(jid, base, n)
                out.append((jid, base, n))
        return out

    def wipe(self) -> list[tuple[str, int]]:
        """Empty every switch of this state (see SwitchSession.wipe); agent files stay."""
        out = []
        for name in self.state.switches:
            s = self.session(name)
            if not s.attach():
                raise ConfigError(f"switch {name} runs no pipeline: nothing to wipe")
            out.append((name, s.wipe()))
        return out

    def status(self) -> list[dict]:
        """One row per job and switch: where it runs (and at which level, when the state has a
        fabric plan: flat, leaf or spine), whether the switch admits it, and its counters."""
        rows = []
        fabric = self.state.fabric
        for name, sw in self.state.switches.items():
            share = controls.job_rows(self.state, sw)
            # (job, level, (slot_base, nslots), senders the switch admits for it)
            jobs = [(jid, "flat" if jid in self.state.jobs else fabric.levels[name], (base, n),
                     sum(1 for k, _, _ in share.table("admission") if k["job"] == jid))
                    for jid, (base, n, _) in sorted(share.jobs.items())]

            def where(jid, lv):
                return {"job": jid, "switch": name, **({"level": lv} if fabric else {})}
            s = self.session(name)
            if not s.attach():
                rows += [{**where(jid, lv), "installed": "no pipeline"} for jid, lv, _, _ in jobs]
                continue
            admitted = s.admission.installed_jobs()
            leveled = s.fabric_roles.installed_jobs() if fabric else set()
            counters = s.job_counters([j[0] for j in jobs])
            for jid, lv, (base, n), senders in jobs:
                # Installed: admitted for the job's slots here, at its level (the role's row).
                ok = admitted.get(jid, ())[:2] == (base, n) and (lv == "flat") == (jid not in
                                                                                  leveled)
                rows.append({**where(jid, lv), "slots": f"{base}..{base + n - 1}",
                             "workers": senders, "installed": "yes" if ok else "no",
                             **counters[jid]})
        return rows

    def port_status(self) -> list[dict]:
        """One row per switch port: packets dropped as malformed or unadmitted there."""
        rows = []
        for name, sw in self.state.switches.items():
            s = self.session(name)
            if not s.attach():
                continue
            got = {}
            for c in (s.ina_check, s.admission):
                got.update(c.read_counters(list(sw.ports)))
            for port in sw.ports:
                rows.append({"switch": name, "port": port,
                             **{n: vals.get(port, 0) for n, vals in got.items()}})
        return rows

    # ------------------------------------------------------------ host agents
    def agent_path(self, job_id: int, rank: int | None = None) -> pathlib.Path:
        """Where a worker's assignment (or, with rank None, the job's JobFile) is written."""
        name = f"job{job_id}.json" if rank is None else f"job{job_id}-rank{rank}.json"
        return self.state.resolve(self.state.agents_dir) / name

    def write_agent_files(self) -> tuple[int, int]:
        """Per job its JobFile, per worker its assignment; stale ones removed. (Files written,
        files removed)."""
        changed = removed = 0
        keep = set()
        for job in self.state.jobs.values():
            sw = self.state.switch_of(job)
            cfg, switch = self.state.job_config(job), (sw.address, sw.udp_port)
            p = self.agent_path(job.id)
            keep.add(p.name)
            changed += write_if_changed(p, JobFile(cfg, switch, self.state.rendezvous).to_dict())
            for rank in range(len(job.members)):
                p = self.agent_path(job.id, rank)
                keep.add(p.name)
                changed += write_if_changed(
                    p, Assignment(cfg, rank, switch, self.state.rendezvous).to_dict())
        fabric = self.state.fabric
        for fjob in (fabric.jobs.values() if fabric is not None else ()):
            # Ranks of a two-level job send to their own rack's leaf: one assignment per rank
            # and no job-wide file (a JobFile names one switch for every rank).
            cfg = fabric.job_config(fjob)
            for rank, worker in enumerate(fabric.members(fjob)):
                p = self.agent_path(fjob.id, rank)
                keep.add(p.name)
                changed += write_if_changed(p, Assignment(
                    cfg, rank, fabric.agent_switch(worker), self.state.rendezvous).to_dict())
        d = self.state.resolve(self.state.agents_dir)
        if d.is_dir():
            for p in list(d.glob("job*.json")):
                if p.name not in keep:
                    p.unlink()
                    removed += 1
        return changed, removed


def run_switches(state: DesiredState) -> dict[int, set[str]]:
    """{job: the switches ("HOST:PORT") its agents send to}, flat and fabric: the run
    rendezvous refuses a join whose file names another (another deployment's job of the same
    id and size)."""
    out = {}
    for j in state.jobs.values():
        sw = state.switch_of(j)
        out[j.id] = {f"{sw.address}:{sw.udp_port}"}
    fabric = state.fabric
    for fjob in (fabric.jobs.values() if fabric is not None else ()):
        out[fjob.id] = {"{}:{}".format(*fabric.agent_switch(w)) for w in fabric.members(fjob)}
    return out


def program_in_process(servicers, state: DesiredState,
                       switches: list[str] | None = None) -> list[Report]:
    """Make switches of `state` hold it through P4Runtime servicers in this process
    (softswitch.p4runtime_server.SoftSwitchServicer, e.g. softswitch.udp.UdpSwitch.servicer()):
    `servicers` is one servicer (a one-switch state) or {switch name: servicer}; `switches`
    which of them (default: every one given). The software switch run standalone and the
    one-machine fabric are programmed by the same classes as any other switch. No agent files
    are written."""
    if not isinstance(servicers, dict):
        servicers = {name: servicers for name in state.switches}

    def connect(sw: Switch) -> Connection:
        return Connection.in_process(servicers[sw.name], sw.device_id)
    with Controller(state, connect=connect) as c:
        return c.deploy(switches or list(servicers), agent_files=False)


def program_star(servicer, job, endpoint: str, macs: list[str], *,
                 pool_slots: int = spec.P4_SIZES["POOL_SLOTS"],
                 slot_capacity: int = spec.DEFAULT_SLOT_CAPACITY) -> list[Report]:
    """One job on a one-switch star through `servicer` (in this process): rank r's host sits
    on switch port r + 1 with MAC macs[r]; the switch accepts INA packets sent to `endpoint`.
    The namespace tests and the L2 rate benchmark build their switch this way."""
    cfg = {"endpoints": [endpoint], "jobs": [dict(job_to_dict(job), workers=[
        {"host": w.host, "port": w.port, "mac": macs[r], "switch_port": r + 1}
        for r, w in enumerate(job.workers)])]}
    return program_in_process(servicer, from_l2_config(cfg, pool_slots=pool_slots,
                                                       slot_capacity=slot_capacity))


def format_table(rows: list[dict]) -> str:
    """Rows as an aligned text table (columns in first-seen order)."""
    if not rows:
        return "(no jobs)"
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(x) for x in cells])
