"""One class per P4 control (p4src/v1model/), each programming and clearing its own
state. The controller mirrors the P4: a control's tables, counters and registers are named here
exactly as in the P4 program and looked up in the P4Info (never an ID).

    P4 control (file)               class here            state
    InaEndpoint (admission.p4)      InaEndpoint           table ina_endpoint
    InaCheck (ina_check.p4)         InaCheck              counter port_malformed
    Admission (admission.p4)        Admission             table admission, counter port_unadmitted
    Aggregator (aggregator.p4),     Aggregator            slot registers, job_* counters
      FromSpine (fabric.p4)                               (both declared in slots.p4)
    Forwarding (forwarding.p4)      Forwarding            tables l2, ipv4_routes
    Priority (priority.p4)          (none)                no state: queue = INA priority
    CongestionDrop (priority.p4)    CongestionDrop        table congestion, job_congestion_drops,
                                                          job_congestion_seen
    WorkerRewrite (egress_rewrite)  WorkerRewrite         table worker_rewrite, job_results
    packet replication engine       Replication           multicast groups
    FabricRoles (fabric.p4)         FabricRoles           tables job_level, leaf_upstream

`entries(state, sw)` says what a control's tables should hold; the controller diffs that with
what the switch holds, so deploying twice writes nothing. Every job's rows come
from `job_rows` (spina.rows: the flat jobs, and with a `fabric:` section each switch's share of
the two-level plan, controller/plan.py `p4_rows`), so one apply installs both and removes
neither, and the software switch's in-process admission writes the same rows.
"""
from __future__ import annotations

from p4.v1 import p4runtime_pb2 as pb

from controller import plan
from controller.model import NO_MAC, DesiredState, Job, Switch
from controller.p4rt import Connection
from controller.registers import RegisterAdapter
from spina import rows, spec
from spina.config import ConfigError
from spina.p4runtime import canonical_entry, decode, match_key


def entry_writes(want: dict, have: dict) -> list:
    """[(Update.Type, Entity)] inserting the entries of `want` missing from `have` and modifying
    those whose action differs (both keyed by match_key, entries in canonical form)."""
    writes = []
    for k, e in want.items():
        if k not in have:
            writes.append((pb.Update.INSERT, pb.Entity(table_entry=e)))
        elif have[k].action.SerializeToString(deterministic=True) != \
                e.action.SerializeToString(deterministic=True):
            writes.append((pb.Update.MODIFY, pb.Entity(table_entry=e)))
    return writes

def job_rows(state: DesiredState, sw: Switch) -> rows.SwitchRows:
    """Every job's rows on `sw` (spina.rows, the one data model of job state): its flat jobs
    and its share of the fabric plan, if it is a leaf or spine of one."""
    out = rows.SwitchRows()
    for job in state.jobs_on(sw):
        senders = [rows.Sender(w.switch_port, w.ip, w.udp_port, w.mac)
                   for w in (state.workers[m] for m in job.members)]
        out.add(rows.flat_job(state.job_config(job), senders))
    if state.fabric is not None and sw.name in state.fabric.levels:
        out.add(plan.p4_rows(state.fabric, sw.name))
    return out


class Control:
    """A P4 control's controller-side twin, named as the P4 control. Subclasses name their
    tables; their counters are those spina.spec.COUNTER_CONTROLS gives the class's name."""
    tables: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.counters = tuple(n for n, c in spec.COUNTER_CONTROLS.items() if c == cls.__name__)

    def __init__(self, conn: Connection):
        self.conn = conn

    @property
    def index(self):
        return self.conn.index

    def entries(self, state: DesiredState, sw: Switch, share: rows.SwitchRows) -> list:
        """The TableEntries this control's tables should hold (not default actions); `share`:
        every job's rows on `sw` (job_rows, computed once per apply)."""
        return []

    def job_entries(self, sw: Switch, share: rows.SwitchRows) -> list:
        """The jobs' rows of this control's tables on `sw` (job_rows), as TableEntries."""
        out = []
        for t, k, a, p in share.entries:
            if t not in self.tables:
                continue
            if not self.index.has("tables", t):
                raise ConfigError(f"switches.{sw.name}.p4info: the program has no table {t!r}, "
                                  "which the fabric plan needs (the leaf/spine roles of "
                                  "p4src/v1model/fabric.p4)")
            names = [x.name for x in self.index.get("actions", a).params]
            try:
                p = rows.program_params(a, p, names)
            except KeyError as e:
                raise ConfigError(f"switches.{sw.name}.p4info: {e.args[0]}") from None
            out.append(self.index.table_entry(t, k, a, p))
        return out

    def default_entries(self, state: DesiredState, sw: Switch) -> list:
        """Default-action entries (MODIFY) this control sets."""
        return []

    def installed(self) -> list:
        """The entries this control's tables hold on the switch now (canonical form)."""
        return [canonical_entry(e) for t in self.tables if self.index.has("tables", t)
                for e in self.conn.read_table(t)]

    def diff(self, state: DesiredState, sw: Switch, share: rows.SwitchRows) -> tuple[list, list]:
        """(deletes, inserts and modifies) as [(Update.Type, Entity)] to reach `state`, whose
        jobs' rows on `sw` are `share`."""
        want = {match_key(e): e for e in self.entries(state, sw, share)}
        have = {match_key(e): e for e in self.installed()}
        deletes = [(pb.Update.DELETE, pb.Entity(table_entry=e))
                   for k, e in have.items() if k not in want]
        writes = entry_writes(want, have)
        for d in self.default_entries(state, sw):
            q = pb.Entity(table_entry=pb.TableEntry(table_id=d.table_id, is_default_action=True))
            cur = [canonical_entry(x.table_entry) for x in self.conn.read([q])]
            if not cur or cur[0].action.SerializeToString(deterministic=True) != \
                    d.action.SerializeToString(deterministic=True):
                writes.append((pb.Update.MODIFY, pb.Entity(table_entry=d)))
        return deletes, writes

    def clear(self) -> list:
        """Deletes of every entry this control's tables hold."""
        return [(pb.Update.DELETE, pb.Entity(table_entry=e)) for e in self.installed()]

    def read_counters(self, indices) -> dict[str, dict[int, int]]:
        return {c: self.conn.read_counters(c, indices) for c in self.counters
                if self.index.has("counters", c)}


class InaEndpoint(Control):
    """INA packets addressed to one of the switch's own addresses are aggregated here."""
    tables = ("ina_endpoint",)

    def entries(self, state, sw, share):
        return [self.index.table_entry("ina_endpoint", {"dst_addr": a}, "accept_ina")
                for a in sw.endpoints]


class InaCheck(Control):
    """Malformed INA packets, counted per ingress port."""


class Admission(Control):
    """(ingress port, source address, UDP port, job, rank) -> the job's slot range and sizes."""
    tables = ("admission",)

    def entries(self, state, sw, share):
        return self.job_entries(sw, share)

    def installed_jobs(self) -> dict[int, tuple[int, int, int]]:
        """{job: (slot_base, nslots, epoch)} as the switch's admission entries say."""
        return {j: (p["slot_base"], p["nslots"], p["epoch"])
                for j, p in self.installed_params().items()}

    def installed_params(self) -> dict[int, dict[str, int]]:
        """{job: the admit action's parameters (epoch, slot_base, nslots, nworkers,
        block_size, nlanes, mcast_grp)} as the switch's admission entries say."""
        out = {}
        t = self.index.get("tables", "admission")
        job_field = next(m.id for m in t.match_fields if m.name == "job")
        admit = self.index.get("actions", "admit")
        pname = {p.id: p.name for p in admit.params}
        for e in self.conn.read_table("admission"):
            if e.action.action.action_id != admit.preamble.id:
                continue
            job = next(decode(m.exact.value) for m in e.match if m.field_id == job_field)
            out[job] = {pname[x.param_id]: decode(x.value) for x in e.action.action.params}
        return out


class Aggregator(Control):
    """Slot registers (cleared per job on removal and reset) and the per-job counters."""

    def __init__(self, conn: Connection, registers: RegisterAdapter):
        super().__init__(conn)
        self.registers = registers

    def register_names(self) -> list[str]:
        """Every slot register the P4Info declares (slot_values_l<L>_e<E> ... as P4 names)."""
        names = [r.preamble.name.rsplit(".", 1)[-1] for r in self.index.p4info.registers]
        return [n for n in names if spec.split_p4_register(n)[0] in spec.REGISTER_NAMES]

    def clear_all(self) -> None:
        """Zero every cell of every slot register: one index-less write per register (a
        cell-by-cell clear of a whole pool is hundreds of thousands of updates)."""
        self.registers.reset(self.register_names())

    def clear_slots(self, slot_base: int, nslots: int) -> None:
        """Zero slots slot_base.. in every slot register: both shadow copies of each slot in
        the per-copy registers, the slot's one cell in the head registers."""
        names = self.register_names()
        per_slot = [n for n in names if n in spec.HEAD_REGISTERS]
        self.registers.clear([n for n in names if n not in per_slot], 2 * slot_base, 2 * nslots)
        if per_slot:
            self.registers.clear(per_slot, slot_base, nslots)


class Forwarding(Control):
    """Ordinary forwarding: each worker's MAC to its port, plus the switch's extra entries.
    An extra entry with `ports` is sprayed per packet (forwarding.p4): its l2 entry names a
    spray group, one per distinct ports list in the order the lists first appear, and
    spray_ports holds the group's port for each turn."""
    tables = ("l2", "ipv4_routes", "spray_ports")

    def entries(self, state, sw, share):
        l2 = {w.mac: ("bridge", {"port": w.switch_port})
              for w in state.workers_on(sw) if w.mac != NO_MAC}
        l2.update((mac, ("bridge", {"port": port})) for mac, port in sw.l2)
        groups = self.spray_groups(sw)
        if groups and not self.index.has("tables", "spray_ports"):
            raise ConfigError(f"switches.{sw.name}.l2: the program has no table 'spray_ports' "
                              "for entries with ports (per-packet spraying is in "
                              "p4src/v1model/forwarding.p4 only)")
        for mac, ports in sw.l2_spray:
            l2[mac] = ("spray", {"group": groups[ports], "ways": len(ports)})
        out = [self.index.table_entry("l2", {"dst_mac": mac}, action, params)
               for mac, (action, params) in sorted(l2.items())]
        out += [self.index.table_entry("spray_ports", {"group": group, "turn": turn}, "bridge",
                                       {"port": port})
                for ports, group in groups.items() for turn, port in enumerate(ports)]
        out += [self.index.table_entry("ipv4_routes", {"dst_addr": prefix}, "route",
                                       {"port": port, "src_mac": smac, "dst_mac": dmac})
                for prefix, port, smac, dmac in sw.routes]
        return out

    @staticmethod
    def spray_groups(sw: Switch) -> dict[tuple[int, ...], int]:
        """Each distinct ports list of the switch's sprayed l2 entries -> its spray group."""
        groups: dict[tuple[int, ...], int] = {}
        for _, ports in sw.l2_spray:
            groups.setdefault(ports, len(groups))
        return groups


class CongestionDrop(Control):
    """Per job: the queue depth above which its loss-tolerant contributions may be dropped and
    its loss bound, which the switch enforces with its own credit register (job_loss_credit)
    whatever the hosts flag. Every switch gets every job with a bound, as a contribution may
    queue at any switch on its way to the aggregating one; a job without an entry (bound 0) is
    never dropped."""
    tables = ("congestion",)

    @staticmethod
    def threshold(job: Job, sw: Switch) -> int:
        """The job's own drop_qdepth, else the switch's, else never."""
        if job.drop_qdepth is not None:
            return job.drop_qdepth
        return spec.QDEPTH_NEVER if sw.drop_qdepth is None else sw.drop_qdepth

    def entries(self, state, sw, share):
        return [self.index.table_entry("congestion", {"job": job.id}, "set_congestion",
                                       {"qdepth": self.threshold(job, sw),
                                        "bound": spec.loss_bound(job.bounded_loss)})
                for job in state.every_job() if spec.loss_bound(job.bounded_loss)]


class WorkerRewrite(Control):
    """Egress: a result copy's replication id -> that worker's MAC, IPv4 and UDP port."""
    tables = ("worker_rewrite",)

    def entries(self, state, sw, share):
        return self.job_entries(sw, share)


class FabricRoles(Control):
    """Two-level aggregation (docs/scale_out.md): job_level, each job's level on this switch
    (as_leaf, as_spine; no entry: flat) and leaf_upstream, at a leaf the spine owning each of
    a job's slots. Only the fabric plan puts rows here; without one they hold nothing."""
    tables = ("job_level", "leaf_upstream")

    def entries(self, state, sw, share):
        return self.job_entries(sw, share)

    def installed_jobs(self) -> set[int]:
        """The jobs with a job_level entry on the switch: the fabric's jobs there."""
        t = self.index.get("tables", "job_level")
        field = next(m.id for m in t.match_fields if m.name == "job")
        return {decode(m.exact.value) for e in self.conn.read_table("job_level")
                for m in e.match if m.field_id == field}


class Replication(Control):
    """The packet replication engine: one multicast group per job, a replica per worker."""

    def _entity(self, g):
        return pb.Entity(packet_replication_engine_entry=pb.PacketReplicationEngineEntry(
            multicast_group_entry=g))

    def diff(self, state, sw, share):
        want = {}
        for grp, replicas in share.groups.items():
            g = want[grp] = pb.MulticastGroupEntry(multicast_group_id=grp)
            for port, rid in replicas:
                g.replicas.add(egress_port=port, instance=rid)
        have = {g.multicast_group_id: g for g in self.conn.read_groups()}
        deletes = [(pb.Update.DELETE, self._entity(pb.MulticastGroupEntry(multicast_group_id=i)))
                   for i in have if i not in want]
        writes = []
        for i, g in want.items():
            if i not in have:
                writes.append((pb.Update.INSERT, self._entity(g)))
            elif sorted((r.egress_port, r.instance) for r in have[i].replicas) != \
                    sorted((r.egress_port, r.instance) for r in g.replicas):
                writes.append((pb.Update.MODIFY, self._entity(g)))
        return deletes, writes

    def clear(self):
        return [(pb.Update.DELETE, self._entity(pb.MulticastGroupEntry(
            multicast_group_id=g.multicast_group_id))) for g in self.conn.read_groups()]
