"""A job's state on one switch, as the P4 program's table rows: the one data model of switch
state (issue 26). Every writer starts from here: the controller diffs these rows with what a
switch holds and writes them over P4Runtime (BMv2, Tofino, the software switch's server), and
the software switch's in-process admission (`softswitch.udp.UdpSwitch.add_job`, the one-machine
path) applies the same rows to its own tables. The data paths read only those tables, so a row
a switch accepts is a row its data path uses, in every mode.

Rows are (table, key, action, params) by the P4 names of spina/spec.py; multicast groups are
group -> [(egress port, replication id)]; `jobs` says which slots each job is admitted for
(job -> (slot_base, nslots, epoch)), so a writer knows whose slots to clear.

    flat_job(cfg, senders)                       one switch aggregates every worker
    leaf_job(cfg, rack, senders, upstream)       a rack's leaf (docs/scale_out.md)
    spine_job(cfg, slot_base, nslots, leaves)    a spine's shard of the job's slots

A row's parameters are p4src's (spec.ACTIONS). A program whose action takes others, derived
from them (the TNA roles' as_leaf: the rack's bit and its local ranks' mask, DERIVED_PARAMS),
gets them from `program_params`, by the names its P4Info declares.

A sender is where one rank's packets come from and where its copies of results go: the
switch port and the host's IPv4, UDP port and MAC. In the UDP mode of the software switch
every sender is on port 0 and has no MAC (`udp_sender`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spina import spec
from spina.config import JobConfig

NO_MAC = "00:00:00:00:00:00"

# Parameters a program's action may take instead of spec's, each derived from the row's own:
# Tofino has no variable shift, so the TNA roles' as_leaf (tofino/include/fabric.p4) takes the
# rack's bit and its local ranks' mask as action data, and no mcast_grp or nlocal.
DERIVED_PARAMS = {
    "as_leaf": {"rack_bit": lambda p: 1 << p["rack"],
                "all_local": lambda p: (1 << p["nlocal"]) - 1},
}


def underivable(action: str, names, row_params) -> list[str]:
    """The parameters in `names` (a program's, for `action`) that a row with parameters
    `row_params` (names) neither has nor derives (DERIVED_PARAMS)."""
    derived = DERIVED_PARAMS.get(action, {})
    return [n for n in names if n not in row_params and n not in derived]


def program_params(action: str, params: dict, names) -> dict:
    """A row's `params` for `action` as the program whose action takes `names` (its P4Info's
    order) needs them: each the row's own or derived from them, the row's others left out (the
    TNA as_leaf reads the job's multicast group from admission); KeyError naming the first
    that is neither (underivable). An action without derived parameters keeps its row's
    (the writer checks them against the program's)."""
    if action not in DERIVED_PARAMS:
        return params
    missing = underivable(action, names, params)
    if missing:
        raise KeyError(f"action {action!r} takes parameter {missing[0]!r}, which the rows "
                       f"(parameters {', '.join(params)}) neither have nor derive")
    derived = DERIVED_PARAMS.get(action, {})
    return {n: params[n] if n in params else derived[n](params) for n in names}


@dataclass(frozen=True)
class Sender:
    """One rank of a job as a switch sees it: its ingress port, addresses and MAC."""
    port: int
    ip: str
    udp_port: int
    mac: str = NO_MAC


@dataclass(frozen=True)
class Upstream:
    """At a leaf: slots slot_base..slot_base+nslots-1 go up to this spine (its port here, its
    MAC and its INA address; a spine listens on the INA UDP port, spec.INA_UDP_PORT, as the
    P4 program's leaf addresses it)."""
    slot_base: int
    nslots: int
    port: int
    ip: str
    mac: str = NO_MAC


@dataclass
class SwitchRows:
    """Table rows, multicast groups and admitted slot ranges of one switch (module doc)."""
    entries: list[tuple[str, dict, str, dict]] = field(default_factory=list)
    groups: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    jobs: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def add(self, other: "SwitchRows") -> "SwitchRows":
        self.entries += other.entries
        for grp, replicas in other.groups.items():
            self.groups.setdefault(grp, []).extend(replicas)
        self.jobs.update(other.jobs)
        return self

    def table(self, name: str) -> list[tuple[dict, str, dict]]:
        """(key, action, params) of the rows of table `name`."""
        return [(k, a, p) for t, k, a, p in self.entries if t == name]


def udp_sender(host: str, port: int) -> Sender:
    """A sender as the software switch's UDP mode admits it: port 0, by (address, UDP port)."""
    return Sender(0, host, port)


def _senders(cfg: JobConfig, senders, slot_base: int, nslots: int) -> SwitchRows:
    """Admission of `senders` by rank 0..n-1 (nworkers = n), a result copy for each through the
    job's multicast group and worker_rewrite."""
    grp = spec.mcast_grp(cfg.job)
    out = SwitchRows(jobs={cfg.job: (slot_base, nslots, cfg.epoch)})
    admit = {"epoch": cfg.epoch, "slot_base": slot_base, "nslots": nslots,
             "nworkers": len(senders), "block_size": cfg.block_size, "nlanes": cfg.nlanes,
             "mcast_grp": grp}
    for rank, s in enumerate(senders):
        rid = spec.rid(cfg.job, rank)
        out.entries.append(("admission", {"ingress_port": s.port, "src_addr": s.ip,
                                          "src_port": s.udp_port, "job": cfg.job, "rank": rank},
                            "admit", admit))
        out.entries.append(("worker_rewrite", {"rid": rid}, "rewrite_for_worker",
                            {"dst_mac": s.mac, "dst_addr": s.ip, "dst_port": s.udp_port}))
        out.groups.setdefault(grp, []).append((s.port, rid))
    return out


def flat_job(cfg: JobConfig, senders: list[Sender]) -> SwitchRows:
    """A flat job: one switch admits every worker (senders[rank]) for all of the job's slots."""
    if len(senders) != cfg.nworkers:
        raise ValueError(f"job {cfg.job}: {len(senders)} senders for {cfg.nworkers} workers")
    return _senders(cfg, senders, cfg.slot_base, cfg.nslots)


def leaf_job(cfg: JobConfig, rack: int, senders: list[Sender],
             upstream: list[Upstream]) -> SwitchRows:
    """Rack `rack` of the two-level job `cfg` at its leaf: the rack's workers by local rank
    (senders, in rank order), job_level as_leaf, and leaf_upstream per slot to its spine."""
    if len(senders) != cfg.racks[rack]:
        raise ValueError(f"job {cfg.job}: {len(senders)} senders for rack {rack} of "
                         f"{cfg.racks[rack]} workers")
    out = _senders(cfg, senders, cfg.slot_base, cfg.nslots)
    out.entries.append(("job_level", {"job": cfg.job}, "as_leaf",
                        {"rack": rack, "nlocal": len(senders), "epoch": cfg.epoch,
                         "mcast_grp": spec.mcast_grp(cfg.job)}))
    for up in upstream:
        params = {"port": up.port, "dst_mac": up.mac, "dst_addr": up.ip}
        out.entries += [("leaf_upstream", {"job": cfg.job, "slot": slot}, "to_spine", params)
                        for slot in range(up.slot_base, up.slot_base + up.nslots)]
    return out


def spine_job(cfg: JobConfig, slot_base: int, nslots: int, leaves: list[Sender]) -> SwitchRows:
    """A spine's shard (slots slot_base..) of the two-level job `cfg`: the job's leaves are its
    workers (rank = the rack's index, leaves[rack]), job_level as_spine."""
    if len(leaves) != len(cfg.racks):
        raise ValueError(f"job {cfg.job}: {len(leaves)} leaves for {len(cfg.racks)} racks")
    out = _senders(cfg, leaves, slot_base, nslots)
    out.entries.append(("job_level", {"job": cfg.job}, "as_spine", {}))
    return out
