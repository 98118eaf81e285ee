"""The fabric plan: two-level (leaf, spine) aggregation and slot sharding (docs/scale_out.md).

A `fabric:` section beside the desired state's switches and workers (controller/model.py):

    fabric:
      racks:
        - {name: r1, leaf: leaf1, workers: [w0, w1, w2, w3]}
        - {name: r2, leaf: leaf2, workers: [w4, w5, w6, w7]}
      spines: [spine1, spine2]
      jobs:
        - id: 7
          racks: [r1, r2]          # ranks: rack by rack, workers in their rack's order
          slot_base: 0
          nslots: 16
          block_size: 256          # optional: every field of spina.config.JOB_OPTIONS
                                   # (nlanes, epoch, priority, bounded_loss, ...), drop_qdepth
          shards:                  # slot -> spine: contiguous ranges covering the job's slots
            - {spine: spine1, slot_base: 0, nslots: 8}
            - {spine: spine2, slot_base: 8, nslots: 8}
      links:                       # P4 targets and the L2 software switch: who sits where
        - {leaf: leaf1, leaf_port: 9, leaf_mac: "02:00:00:00:02:01",
           spine: spine1, spine_port: 1, spine_mac: "02:00:00:00:03:01"}
                                   # two UDP-mode software switches need no link

Every error names the field (`fabric.jobs[0].shards[1].slot_base: ...`). One install path on
every target: `controller.state.load` keeps this section as the desired state's `fabric`, and
each switch's share (`p4_rows`, spina.rows: admission, worker_rewrite, multicast groups,
job_level, leaf_upstream) joins the flat jobs' rows in the per-control diff
(controller/controls.py), so a deploy, a run's new epoch, a wipe or a job change handles both,
over gRPC or in process (controller.controller.program_in_process).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

from controller import tofino
from controller.model import (
    DesiredState,
    JobOptions,
    fits_program,
    load_yaml,
    mac_address,
    parse_flat,
)
from controller.pipeline import read_p4info
from spina import rows, spec, wire
from spina.config import JOB_OPTIONS, MAX_RACKS, ConfigError, JobConfig, WorkerAddr, job_options
from spina.fields import integer, mapping, need, optional_list, string

# A job: up to 32 racks (the spine's bitmap has one bit per rack), each of up to 32 workers
# (the leaf's bitmap has one bit per worker of its rack, by local rank): 1024 workers.
MAX_WORKERS_PER_RACK = wire.MAX_WORKERS
LEAF, SPINE = "leaf", "spine"
ROLE_ACTIONS = {LEAF: "as_leaf", SPINE: "as_spine"}  # job_level's action of each level


@dataclass(frozen=True)
class Rack:
    name: str
    leaf: str
    workers: tuple[str, ...]


@dataclass(frozen=True)
class Shard:
    """Slots slot_base..slot_base+nslots-1 of a job aggregate at `spine`."""
    spine: str
    slot_base: int
    nslots: int


@dataclass(frozen=True)
class FabricJob(JobOptions):
    """A two-level job: its racks (ranks rack by rack), slot shards and the JobOptions of a
    flat job (bounded loss works across both levels, docs/scale_out.md)."""
    id: int
    racks: tuple[str, ...]
    slot_base: int
    nslots: int
    shards: tuple[Shard, ...]


@dataclass(frozen=True)
class Link:
    """The link between a leaf and a spine, as P4 tables need it: each end's port and MAC."""
    leaf: str
    leaf_port: int
    leaf_mac: str
    spine: str
    spine_port: int
    spine_mac: str


@dataclass
class Fabric:
    state: DesiredState
    racks: dict[str, Rack]
    spines: tuple[str, ...]
    jobs: dict[int, FabricJob]
    links: dict[tuple[str, str], Link] = None  # (leaf, spine) -> Link

    @property
    def levels(self) -> dict[str, str]:
        """Each fabric switch's level: LEAF or SPINE (one per switch)."""
        out = {r.leaf: LEAF for r in self.racks.values()}
        out.update({s: SPINE for s in self.spines})
        return out

    def members(self, job: FabricJob) -> tuple[str, ...]:
        """The job's workers in rank order: rack by rack."""
        return tuple(w for r in job.racks for w in self.racks[r].workers)

    def job_config(self, job: FabricJob) -> JobConfig:
        """The job as its agents see it: every worker, ranks in `members` order (rack by
        rack), the rack sizes (each rank's switch rank: JobConfig.switch_rank)."""
        ws = self.state.workers
        # Each slot's spine: rounds complete in send order only among one spine's slots.
        groups = tuple(next(i for i, s in enumerate(job.shards)
                            if s.slot_base <= slot < s.slot_base + s.nslots)
                       for slot in range(job.slot_base, job.slot_base + job.nslots))
        return JobConfig(job=job.id, slot_base=job.slot_base, nslots=job.nslots,
                         **job.options(), slot_groups=groups if len(job.shards) > 1 else (),
                         racks=tuple(len(self.racks[r].workers) for r in job.racks),
                         workers=tuple(WorkerAddr(r, ws[m].ip, ws[m].udp_port)
                                       for r, m in enumerate(self.members(job))))

    def switch_address(self, name: str) -> tuple[str, int]:
        sw = self.state.switches[name]
        return sw.address, sw.udp_port

    def agent_switch(self, worker: str) -> tuple[str, int]:
        """Where a worker's agent sends: its rack's leaf."""
        return self.switch_address(next(r.leaf for r in self.racks.values()
                                        if worker in r.workers))

    def leaf_jobs(self, leaf: str) -> list[tuple[FabricJob, int]]:
        """(job, rack index) of every rack whose leaf is `leaf`."""
        return [(job, i) for job in sorted(self.jobs.values(), key=lambda j: j.id)
                for i, r in enumerate(job.racks) if self.racks[r].leaf == leaf]

    def link_ends(self, leaf: str, spine: str, job: int) -> tuple[rows.Sender, rows.Sender]:
        """(the leaf as its spine sees it, the spine as the leaf sees it): ports from the
        link's ends, addresses and UDP ports from the switches. Two UDP-mode software switches
        (port 0 among their ports) with no link listed meet as the UDP mode does (port 0, no
        MAC); the switch refuses port-0 rows if it is not in UDP mode after all."""
        st = self.state
        a, b = st.switches[leaf], st.switches[spine]
        got = (self.links or {}).get((leaf, spine))
        if got is None:
            udp = all(s.target == "softswitch" and 0 in s.ports for s in (a, b))
            need(udp, "fabric.links", f"no link between leaf {leaf!r} and spine {spine!r} "
                  f"(job {job} needs one on a P4 or L2-mode switch: its ports and MACs)")
            return rows.udp_sender(a.address, a.udp_port), rows.udp_sender(b.address, b.udp_port)
        return (rows.Sender(got.spine_port, a.address, a.udp_port, got.leaf_mac),
                rows.Sender(got.leaf_port, b.address, b.udp_port, got.spine_mac))

    def spine_jobs(self, spine: str) -> list[JobConfig]:
        """The jobs a spine admits: its shard of each, the job's leaves as its workers (rank =
        the rack's index in the job)."""
        out = []
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            for s in job.shards:
                if s.spine == spine:
                    leaves = tuple(WorkerAddr(i, *self.switch_address(self.racks[r].leaf))
                                   for i, r in enumerate(job.racks))
                    out.append(JobConfig(job=job.id, slot_base=s.slot_base, nslots=s.nslots,
                                         **job.options(), workers=leaves))
        return out


def p4_rows(fabric: Fabric, name: str) -> rows.SwitchRows:
    """Switch `name`'s share of the plan as table rows (spina.rows; p4src/v1model/fabric.p4):
    at a leaf, its rack of each job (its workers by local rank, job_level as_leaf,
    leaf_upstream per slot to the slot's spine); at a spine, its shard of each job (the job's
    leaves as ranks, job_level as_spine)."""
    level = fabric.levels.get(name)
    need(level is not None, f"switches.{name}", "not a leaf or spine of the fabric plan")
    st = fabric.state
    sw = st.switches[name]
    out = rows.SwitchRows()
    for i, job in sorted((i, j) for i, j in enumerate(fabric.jobs.values())):
        where = f"fabric.jobs[{i}]"
        fits_program(job, sw, where)
        cfg = fabric.job_config(job)
        if level == LEAF:
            for k, rname in enumerate(job.racks):
                if fabric.racks[rname].leaf != name:
                    continue
                senders = [rows.Sender(w.switch_port, w.ip, w.udp_port, w.mac)
                           for w in (st.workers[m] for m in fabric.racks[rname].workers)]
                ups = []
                for s in job.shards:
                    spine = fabric.link_ends(name, s.spine, job.id)[1]
                    ups.append(rows.Upstream(s.slot_base, s.nslots, spine.port, spine.ip,
                                             spine.mac))
                out.add(rows.leaf_job(cfg, k, senders, ups))
        else:
            for s in job.shards:
                if s.spine == name:
                    leaves = [fabric.link_ends(fabric.racks[r].leaf, name, job.id)[0]
                              for r in job.racks]
                    out.add(rows.spine_job(cfg, s.slot_base, s.nslots, leaves))
    return out


def status(fabric: Fabric, switches: dict) -> dict[str, dict[str, dict[int, dict[str, int]]]]:
    """Per level, per switch, per job: the switch's job counters (spina.spec.JOB_COUNTERS),
    read in process from running software switches (name -> softswitch.udp.UdpSwitch)."""
    out: dict[str, dict] = {LEAF: {}, SPINE: {}}
    for name, level in sorted(fabric.levels.items()):
        jobs = ([job.id for job, _ in fabric.leaf_jobs(name)] if level == LEAF
                else [cfg.job for cfg in fabric.spine_jobs(name)])
        out[level][name] = {j: switches[name].pipeline.job_counters(j) for j in jobs}
    return out


def load(path) -> Fabric:
    """The desired state with its `fabric` section from a YAML file (errors name the file)."""
    return load_yaml(path, parse)


def _fabric_target(state, sw, where: str, role: str) -> None:
    """A tofino switch is a leaf or spine only if its TNA program has the fabric roles, as its
    P4Info says (controller/tofino.py has_roles): no program compiled so far has them."""
    if sw.target != "tofino":
        return
    path = state.resolve(sw.p4info)
    need(path is not None and path.exists(), where,
          f"switch {sw.name!r} is a tofino switch, and its P4Info {path} does not exist: the "
          f"plan cannot tell whether its TNA program has the {role} role")
    info = read_p4info(path, sw.target, f"switch {sw.name}: field")
    need(tofino.has_roles(info), where, f"switch {sw.name!r} is a tofino switch, and its TNA "
          f"program ({path}) has no {role} role: its P4Info declares no "
          f"{' / '.join(tofino.ROLE_TABLES)} tables ({tofino.NO_ROLES})")
    action = ROLE_ACTIONS[role]
    declared = [a for a in info.actions if a.preamble.name.rsplit(".", 1)[-1] == action]
    need(bool(declared), where, f"switch {sw.name!r} is a tofino switch, and its TNA program "
          f"({path}) declares no action {action!r}, which the {role} role's rows name")
    names = [p.name for p in declared[0].params]
    for name in rows.underivable(action, names, [p for p, _ in spec.ACTIONS[action].params]):
        need(False, where, f"switch {sw.name!r} is a tofino switch, and its TNA program's "
              f"action {action!r} ({path}) takes parameter {name!r}, which the plan's rows "
              "neither have nor derive (spina/rows.py DERIVED_PARAMS)")


def parse(doc, path: pathlib.Path | None = None) -> Fabric:
    """The desired state with its `fabric` section, validated (ConfigError names the field)."""
    need(isinstance(doc, dict), "(top)", "must be a mapping")
    need("fabric" in doc, "fabric", "required field is missing")
    state = parse_flat(doc, path)  # raw keeps the fabric section: `save` writes it back
    f = mapping(doc["fabric"], "fabric", {"racks", "spines", "jobs"}, {"links"})
    switches, workers = state.switches, state.workers

    def switch(d, key, where):
        name = string(d, key, where)
        need(name in switches, f"{where}.{key}",
              f"unknown switch {name!r} (switches: {', '.join(switches)})")
        return name

    racks: dict[str, Rack] = {}
    rack_of: dict[str, str] = {}
    need(isinstance(f["racks"], list) and f["racks"], "fabric.racks", "must be a non-empty list")
    for i, d in enumerate(f["racks"]):
        w = f"fabric.racks[{i}]"
        mapping(d, w, {"name", "leaf", "workers"}, set())
        name = string(d, "name", w)
        need(name not in racks, f"{w}.name", f"duplicate rack {name!r}")
        leaf = switch(d, "leaf", w)
        _fabric_target(state, switches[leaf], f"{w}.leaf", "leaf")
        members = optional_list(d, "workers", w)
        need(1 <= len(members) <= MAX_WORKERS_PER_RACK, f"{w}.workers",
              f"must list 1..{MAX_WORKERS_PER_RACK} workers (the leaf's rank bitmap), "
              f"got {len(members)}")
        for k, m in enumerate(members):
            wk = f"{w}.workers[{k}]"
            need(isinstance(m, str) and m in workers, wk, f"unknown worker {m!r}")
            need(m not in rack_of, wk, f"worker {m!r} is also in rack {rack_of.get(m)!r}")
            need(workers[m].switch == leaf, wk, f"worker {m!r} sits on switch "
                  f"{workers[m].switch!r}, not on this rack's leaf {leaf!r}")
            rack_of[m] = name
        racks[name] = Rack(name, leaf, tuple(members))

    spines_doc = f["spines"]
    need(isinstance(spines_doc, list) and spines_doc, "fabric.spines",
          "must be a non-empty list of switch names")
    leaves = {r.leaf for r in racks.values()}
    for i, name in enumerate(spines_doc):
        need(isinstance(name, str) and name in switches, f"fabric.spines[{i}]",
              f"unknown switch {name!r} (switches: {', '.join(switches)})")
        need(spines_doc.index(name) == i, f"fabric.spines[{i}]", f"spine {name!r} listed twice")
        _fabric_target(state, switches[name], f"fabric.spines[{i}]", "spine")
        need(name not in leaves, f"fabric.spines[{i}]", f"switch {name!r} is also a rack's leaf "
              "(one level per switch)")
        need(switches[name].udp_port == spec.INA_UDP_PORT, f"switches.{name}.udp_port",
              f"spine {name!r} must listen on the INA UDP port {spec.INA_UDP_PORT}, not "
              f"{switches[name].udp_port}: a leaf names a slot's spine by its IPv4 address (P4: "
              "leaf_upstream's to_spine); give each spine an address of its own (127.0.0.2, "
              "127.0.0.3, ... on one host)")
    spines = tuple(spines_doc)
    addrs: dict[tuple, str] = {}
    for name in sorted(leaves | set(spines)):
        sw = switches[name]
        a = (sw.address, sw.udp_port)
        need(a not in addrs, f"switches.{name}.udp_port",
              f"{a[0]}:{a[1]} is also switch {addrs.get(a)!r}'s INA endpoint")
        addrs[a] = name

    jobs: dict[int, FabricJob] = {}
    jobs_doc = f["jobs"]
    need(isinstance(jobs_doc, list), "fabric.jobs", "must be a list")
    for i, d in enumerate(jobs_doc):
        w = f"fabric.jobs[{i}]"
        mapping(d, w, {"id", "racks", "slot_base", "nslots", "shards"},
                set(JOB_OPTIONS) | {"drop_qdepth"})
        jid = integer(d, "id", w, 0, spec.MAX_JOB_ID)
        need(jid not in jobs and jid not in state.jobs, f"{w}.id", f"duplicate job id {jid}")
        job_racks = optional_list(d, "racks", w)
        need(1 <= len(job_racks) <= MAX_RACKS, f"{w}.racks",
              f"must list 1..{MAX_RACKS} racks (the spine's rack bitmap), got {len(job_racks)}")
        for k, r in enumerate(job_racks):
            need(isinstance(r, str) and r in racks, f"{w}.racks[{k}]", f"unknown rack {r!r}")
            need(job_racks.index(r) == k, f"{w}.racks[{k}]", f"rack {r!r} listed twice")
            other = next((o for o in job_racks[:k] if racks[o].leaf == racks[r].leaf), None)
            need(other is None, f"{w}.racks[{k}]", f"rack {r!r} has the same leaf "
                  f"{racks[r].leaf!r} as rack {other!r}: one rack per leaf in a job")
        try:
            options = job_options(d)
        except ConfigError as e:
            raise e.at(w) from None
        options.update(slot_base=integer(d, "slot_base", w, 0, 1 << 15),
                       nslots=integer(d, "nslots", w, 1, 1 << 15))
        job = FabricJob(id=jid, racks=tuple(job_racks), shards=(), **options,
                        drop_qdepth=integer(d, "drop_qdepth", w, 0, spec.QDEPTH_NEVER)
                        if "drop_qdepth" in d else None)
        job = FabricJob(**{**job.__dict__, "shards": _shards(d, w, job, spines)})
        for s in job.shards:
            _check_pool(state, jobs, job, s.spine, s.slot_base, s.nslots, w, racks)
        for r in job.racks:
            _check_pool(state, jobs, job, racks[r].leaf, job.slot_base, job.nslots, w, racks)
        jobs[jid] = job
    links: dict[tuple[str, str], Link] = {}
    for i, d in enumerate(optional_list(f, "links", "fabric")):
        w = f"fabric.links[{i}]"
        mapping(d, w, {"leaf", "leaf_port", "leaf_mac", "spine", "spine_port", "spine_mac"},
                set())
        leaf, spine = string(d, "leaf", w), string(d, "spine", w)
        need(leaf in leaves, f"{w}.leaf", f"{leaf!r} is no rack's leaf")
        need(spine in spines, f"{w}.spine", f"{spine!r} is not one of fabric.spines")
        need((leaf, spine) not in links, w, f"a second link between {leaf!r} and {spine!r}")
        ln = Link(leaf, integer(d, "leaf_port", w, 0, 511), mac_address(d, "leaf_mac", w), spine,
                  integer(d, "spine_port", w, 0, 511), mac_address(d, "spine_mac", w))
        for end, port in ((leaf, ln.leaf_port), (spine, ln.spine_port)):
            need(port in switches[end].ports, f"{w}.{'leaf' if end == leaf else 'spine'}_port",
                  f"port {port} is not in switch {end}'s ports {list(switches[end].ports)}")
        links[(leaf, spine)] = ln
    fabric = Fabric(state, racks, spines, jobs, links)
    state.fabric = fabric
    for i, job in enumerate(jobs.values()):  # the one schema's limits, at every level
        try:
            fabric.job_config(job).validate()
            for s in job.shards:
                for cfg in fabric.spine_jobs(s.spine):
                    cfg.validate()
        except ConfigError as e:
            raise e.at(f"fabric.jobs[{i}]") from None
    return fabric


def _shards(d: dict, w: str, job: FabricJob, spines: tuple[str, ...]) -> tuple[Shard, ...]:
    """The job's shards: known spines, inside the job's slots, each slot owned exactly once."""
    owner: dict[int, tuple[int, str]] = {}
    out = []
    shards = optional_list(d, "shards", w)
    need(shards, f"{w}.shards", "must give at least one {spine, slot_base, nslots}")
    for k, s in enumerate(shards):
        ws = f"{w}.shards[{k}]"
        mapping(s, ws, {"spine", "slot_base", "nslots"}, set())
        spine = string(s, "spine", ws)
        need(spine in spines, f"{ws}.spine", f"{spine!r} is not one of fabric.spines "
              f"({', '.join(spines)})")
        base, n = integer(s, "slot_base", ws, 0, 1 << 15), integer(s, "nslots", ws, 1, 1 << 15)
        need(job.slot_base <= base and base + n <= job.slot_base + job.nslots, f"{ws}.slot_base",
              f"slots {base}..{base + n - 1} outside the job's {job.slot_base}.."
              f"{job.slot_base + job.nslots - 1}")
        for slot in range(base, base + n):
            need(slot not in owner, f"{ws}.slot_base", f"slot {slot} is also owned by spine "
                  f"{owner.get(slot, (0, ''))[1]!r} (shards[{owner.get(slot, (0, ''))[0]}]): "
                  "a slot aggregates at one spine")
            owner[slot] = (k, spine)
        out.append(Shard(spine, base, n))
    missing = [s for s in range(job.slot_base, job.slot_base + job.nslots) if s not in owner]
    need(not missing, f"{w}.shards",
          f"slots {missing and missing[0]}.. ({len(missing)} of them) are owned by no spine")
    return tuple(out)


def _check_pool(state: DesiredState, jobs: dict, job: FabricJob, name: str, base: int, n: int,
                w: str, racks: dict) -> None:
    """Slots base..base+n-1 fit switch `name`'s pool and overlap no other job's there."""
    sw = state.switches[name]
    need(base + n <= sw.pool_slots, f"{w}.nslots", f"slots {base}..{base + n - 1} exceed "
          f"switch {name}'s pool of {sw.pool_slots}")
    used = [(j.id, j.slot_base, j.nslots) for j in state.jobs_on(sw)]
    for other in jobs.values():
        used += [(other.id, s.slot_base, s.nslots) for s in other.shards if s.spine == name]
        if any(racks[r].leaf == name for r in other.racks):
            used.append((other.id, other.slot_base, other.nslots))
    for jid, b, m in used:
        need(not (base < b + m and b < base + n), f"{w}.slot_base",
              f"slots {base}..{base + n - 1} overlap job {jid}'s {b}..{b + m - 1} on switch {name}")
