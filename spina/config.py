"""Job configuration: loaded and validated in one place, errors name the field."""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import pathlib
from dataclasses import dataclass

from spina import spec, wire
from spina.communication import Communication
from spina.fields import ConfigError, load_json, number_field  # ConfigError: importers name it here

MAX_RACKS = 32  # a job's racks: the spine's bitmap has one bit per rack (leaf)
# a worker's fields in an L2 switch config (softswitch.l2)
L2_WORKER_FIELDS = ("mac", "switch_port")

# DLCP per-packet classification of a job's contributions (host_agent/dlcp.py, docs/dlcp.md).
# priority_policy: "fixed" every packet in the job's `priority` queue; "layer" a call's packets
#   go higher the sooner the next forward pass needs its layers (`priority` .. 7).
# loss_tolerant_policy: "none" no packet may be dropped; "magnitude" the packets of smallest
#   gradient magnitude, within the job's `bounded_loss`, carry the loss-tolerant flag.
PRIORITY_POLICIES = ("fixed", "layer")
# loss_deadline: seconds (fixed), or this: each round's deadline follows the measured round
#   latency of its slot group (host_agent/recovery.py, RttEstimator.loss_deadline).
LOSS_DEADLINE_AUTO = "auto"
LOSS_TOLERANT_POLICIES = ("none", "magnitude")


def _is_ipv4(host) -> bool:
    """A dotted-quad string (not a name, not an int: files carry addresses as text)."""
    if not isinstance(host, str):
        return False
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class WorkerAddr:
    rank: int
    host: str
    port: int


@dataclass(frozen=True)
class JobConfig:
    """One aggregation job as the switch and its agents see it.

    job: job id (16 bits on the wire). epoch: incarnation of the job; packets of another
    epoch are stale. workers: one address per rank 0..n-1. slot_base/nslots: the job's share
    of the switch's slot pool (also the agent's window: one outstanding packet per slot).
    block_size: elements per block (B). nlanes: blocks fused per packet (k).
    bounded_loss: opt-in DLCP mode: at most this fraction of a call's blocks may be completed
    without every worker (0: off, every result exact). loss_deadline: seconds a round may wait
    for missing workers before an agent asks the switch to complete it anyway, or "auto"
    (LOSS_DEADLINE_AUTO): twice the measured latency of the round's slot group, 2-50 ms.
    priority_policy, loss_tolerant_policy: how agents set each packet's priority and
    loss-tolerant flag (PRIORITY_POLICIES, LOSS_TOLERANT_POLICIES; host_agent/dlcp.py). The
    defaults ("fixed", "none") send every packet as before: the job's priority, never droppable.
    slot_groups: per slot of the job (in order), the group whose rounds complete in the order
    they were sent: the spine aggregating the slot when a two-level job's slots are sharded
    (docs/scale_out.md). The agent's fast retransmit compares rounds within a group only; ()
    (the default): one group, a single switch.
    racks: a two-level job's rack sizes (docs/scale_out.md), ranks rack by rack: rank r's own
    switch is its rack's leaf, which knows it by its rank within the rack (`switch_rank`)
    among `switch_ranks` workers; the wire's rank field and 32-bit bitmaps count a switch's
    workers, so a rack has at most MAX_WORKERS and a job at most MAX_RACKS racks (the spine's
    bitmap), up to MAX_RACKS x MAX_WORKERS workers. () (the default): a flat job, one switch,
    wire rank = job rank, at most MAX_WORKERS workers. The rack sizes are job-wide (the
    same in every rank's file); each rank derives its switch rank from them.
    lane_bits: the width of a float tensor's values on the wire (wire.LANE_BITS: 32, the
    default; 16 or 8, narrow lanes: stochastically rounded, docs/bits.md). int32 tensors always
    travel as int32. Flat jobs only (the leaf/spine roles carry int32 lanes).
    """
    job: int
    workers: tuple[WorkerAddr, ...]
    slot_base: int = 0
    nslots: int = 16
    block_size: int = 256
    nlanes: int = 56
    epoch: int = 1
    priority: int = 0
    bounded_loss: float = 0.0
    loss_deadline: float | str = 0.05
    priority_policy: str = "fixed"
    loss_tolerant_policy: str = "none"
    slot_groups: tuple[int, ...] = ()
    racks: tuple[int, ...] = ()
    lane_bits: int = 32

    @property
    def nworkers(self) -> int:
        """The job's total worker count (quantization headroom, DLCP shares, world size)."""
        return len(self.workers)

    def rack_of(self, rank: int) -> tuple[int, int]:
        """(first rank, worker count) of the rack holding `rank`: the ranks its switch serves
        (the whole job when flat)."""
        first = 0
        for size in self.racks:
            if rank < first + size:
                return first, size
            first += size
        return 0, self.nworkers

    def switch_rank(self, rank: int) -> int:
        """The rank `rank` goes by on the wire: at its own switch (the rack's leaf, or the one
        flat switch)."""
        return rank - self.rack_of(rank)[0]

    def switch_ranks(self, rank: int) -> int:
        """How many workers `rank`'s own switch aggregates (its rack's size; flat: all)."""
        return self.rack_of(rank)[1]

    def validate(self, pool_slots: int | None = None,
                 slot_capacity: int | None = None) -> "JobConfig":
        def need(cond, fieldname, msg):
            if not cond:
                raise ConfigError(f"job {self.job}: field '{fieldname}': {msg}", fieldname, msg)
        need(type(self.job) is int and 0 <= self.job <= spec.MAX_JOB_ID, "job",
             f"must be in 0..{spec.MAX_JOB_ID} (a switch's replication ids, job x "
             f"{wire.MAX_WORKERS} + rank + 1, are 16 bits), got {self.job!r}")
        need(0 <= self.epoch < 1 << 16, "epoch", "must be in 0..65535")
        if self.racks:
            need(1 <= len(self.racks) <= MAX_RACKS, "racks",
                 f"need 1..{MAX_RACKS} racks (the spine's rack bitmap), got {len(self.racks)}")
            for i, size in enumerate(self.racks):
                need(type(size) is int and 1 <= size <= wire.MAX_WORKERS, f"racks[{i}]",
                     f"a rack has 1..{wire.MAX_WORKERS} workers (its leaf's rank bitmap), "
                     f"got {size!r}")
            need(sum(self.racks) == self.nworkers, "racks",
                 f"rack sizes add up to {sum(self.racks)}, the job has {self.nworkers} workers")
        else:
            need(1 <= self.nworkers <= wire.MAX_WORKERS, "workers",
                 f"need 1..{wire.MAX_WORKERS} workers (a flat job; more need 'racks'), "
                 f"got {self.nworkers}")
        need([w.rank for w in self.workers] == list(range(self.nworkers)), "workers",
             "ranks must be 0..n-1 in order")
        seen = {}
        for w in self.workers:
            where = f"workers[{w.rank}]"
            need(_is_ipv4(w.host), f"{where}.host", f"{w.host!r} is not an IPv4 address")
            need(0 < w.port < 1 << 16, f"{where}.port", f"{w.port} is not a UDP port (1..65535)")
            need((w.host, w.port) not in seen, f"{where}.port",
                 f"{w.host}:{w.port} is also the address of rank {seen.get((w.host, w.port))}")
            seen[(w.host, w.port)] = w.rank
        need(self.nslots >= 1, "nslots", "must be at least 1")
        need(0 <= self.slot_base and self.slot_base + self.nslots <= (pool_slots or 1 << 16),
             "slot_base", f"slots {self.slot_base}..{self.slot_base + self.nslots - 1} "
             f"outside the pool of {pool_slots} slots")
        need(1 <= self.block_size < 1 << 16, "block_size", "must be in 1..65535")
        need(1 <= self.nlanes <= wire.MAX_LANES, "nlanes", f"must be in 1..{wire.MAX_LANES}")
        # a narrow job's float tensors travel in its width: its rows may hold more values
        # (its int32 tensors must then fit: host_agent.agent refuses them otherwise)
        width = wire.LANE_FLAGS.get(self.lane_bits, 0)
        need(wire.packet_len(self.nlanes, self.block_size, self.nlanes, width)
             <= wire.MAX_UDP_PAYLOAD, "nlanes",
             f"{self.nlanes} lanes of {self.block_size} elements exceed a UDP datagram; "
             f"at most {wire.max_lanes_for(self.block_size, flags=width)} fit")
        if slot_capacity is not None:
            need(self.nlanes * self.block_size <= slot_capacity, "block_size",
                 f"nlanes*block_size = {self.nlanes * self.block_size} exceeds the switch's "
                 f"slot capacity of {slot_capacity} elements")
        need(0 <= self.priority < 8, "priority", "must be in 0..7")
        need(0.0 <= self.bounded_loss < 1.0, "bounded_loss", "must be a fraction in [0, 1)")
        need(self.loss_deadline == LOSS_DEADLINE_AUTO or (
            isinstance(self.loss_deadline, (int, float))
            and not isinstance(self.loss_deadline, bool) and self.loss_deadline > 0),
            "loss_deadline",
            f"{self.loss_deadline!r} is neither positive seconds nor '{LOSS_DEADLINE_AUTO}'")
        need(self.priority_policy in PRIORITY_POLICIES, "priority_policy",
             f"{self.priority_policy!r} is not one of {', '.join(PRIORITY_POLICIES)}")
        need(self.loss_tolerant_policy in LOSS_TOLERANT_POLICIES, "loss_tolerant_policy",
             f"{self.loss_tolerant_policy!r} is not one of {', '.join(LOSS_TOLERANT_POLICIES)}")
        need(type(self.lane_bits) is int and self.lane_bits in wire.LANE_BITS, "lane_bits",
             f"{self.lane_bits!r} is not one of {', '.join(map(str, wire.LANE_BITS))}")
        need(self.lane_bits == 32 or not self.racks, "lane_bits",
             f"{self.lane_bits}-bit lanes need a flat job (the leaf/spine roles carry int32 "
             "lanes only)")
        need(not self.slot_groups or len(self.slot_groups) == self.nslots, "slot_groups",
             f"one group per slot: {len(self.slot_groups)} groups for {self.nslots} slots")
        need(all(type(g) is int and 0 <= g < 256 for g in self.slot_groups), "slot_groups",
             "groups must be integers in 0..255")
        need(self.loss_tolerant_policy == "none" or self.bounded_loss > 0, "loss_tolerant_policy",
             f"{self.loss_tolerant_policy!r} needs bounded_loss > 0 (with no loss allowed, no "
             "packet may be dropped)")
        return self

    @classmethod
    def from_dict(cls, d: dict) -> "JobConfig":
        """A job from its JSON/YAML form; every wrong type or value is a ConfigError naming
        the field. Values are taken as they are (no rounding, no str -> int conversion)."""
        known = set(JOB_OPTIONS) | {"job", "workers", "slot_groups", "racks"}
        if not isinstance(d, dict):
            raise ConfigError(f"a job must be a mapping of fields, got {d!r}")
        for k in d:
            if k not in known:
                raise ConfigError(f"unknown field '{k}' (known: {', '.join(sorted(known))})")
        if "job" not in d or "workers" not in d:
            raise ConfigError("fields 'job' and 'workers' are required")
        if not isinstance(d["workers"], list):
            raise ConfigError(f"field 'workers': must be a list of {{host, port}}, "
                              f"got {d['workers']!r}")
        workers = tuple(WorkerAddr(r, *_address(w, f"workers[{r}]", L2_WORKER_FIELDS))
                        for r, w in enumerate(d["workers"]))
        kw = job_options(d)
        kw["job"] = number_field(d, "job", int)
        for k, what in (("slot_groups", "a list of integers, one per slot"),
                        ("racks", "a list of rack sizes (ranks rack by rack)")):
            if k in d:
                if not isinstance(d[k], list):
                    raise ConfigError(f"field '{k}': must be {what}, got {d[k]!r}")
                kw[k] = tuple(d[k])
        return cls(workers=workers, **kw).validate()


# The one job schema: the fields every job file, desired-state job (flat or of a fabric plan)
# and job option may set, with their kinds; defaults and limits are JobConfig's (its fields'
# defaults, `validate`), so no parser keeps a copy of either.
JOB_OPTIONS = {"slot_base": int, "nslots": int, "block_size": int, "nlanes": int, "epoch": int,
               "priority": int, "bounded_loss": float, "loss_deadline": "seconds",
               "priority_policy": str, "loss_tolerant_policy": str, "lane_bits": int}
JOB_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JobConfig) if f.name in JOB_OPTIONS}


def job_options(d: dict, where: str = "") -> dict:
    """The JOB_OPTIONS given in the mapping `d`, type-checked (a bool is never a number, a
    number never a string): keyword arguments for JobConfig. `where` prefixes the field's name
    in the error (e.g. "jobs[1]."); ranges are JobConfig.validate's."""
    out = {}
    for k, kind in JOB_OPTIONS.items():
        if k not in d:
            continue
        v = d[k]
        if kind == "seconds" and isinstance(v, str):  # "auto"; validate() names other words
            out[k] = v
        elif kind is str:
            if not isinstance(v, str):
                raise ConfigError(f"field '{where}{k}': {v!r} is not a string", k,
                                  f"{v!r} is not a string")
            out[k] = v
        else:
            out[k] = number_field(d, k, int if kind is int else float, where)
    return out


def _address(d, where: str, extra: tuple = ()) -> tuple[str, int]:
    """(host, port) of a {"host": IPv4, "port": 1..65535} mapping (`extra`: other known keys)."""
    if not isinstance(d, dict):
        raise ConfigError(f"field '{where}': must be a mapping with 'host' and 'port', got {d!r}")
    for k in d:
        if k not in ("host", "port") + extra:
            raise ConfigError(f"field '{where}.{k}': unknown field "
                              f"(known: {', '.join(('host', 'port') + extra)})")
    for k in ("host", "port"):
        if k not in d:
            raise ConfigError(f"field '{where}.{k}': required field is missing")
    if not _is_ipv4(d["host"]):
        raise ConfigError(f"field '{where}.host': {d['host']!r} is not an IPv4 address")
    port = number_field(d, "port", int, f"{where}.")
    if not 0 < port < 1 << 16:
        raise ConfigError(f"field '{where}.port': {port} is not a UDP port (1..65535)")
    return d["host"], port


def job_to_dict(job: JobConfig) -> dict:
    """The inverse of `JobConfig.from_dict` (JSON-ready)."""
    return {"job": job.job, "epoch": job.epoch, "priority": job.priority,
            "slot_base": job.slot_base, "nslots": job.nslots, "block_size": job.block_size,
            "nlanes": job.nlanes, "bounded_loss": job.bounded_loss,
            "loss_deadline": job.loss_deadline, "priority_policy": job.priority_policy,
            "loss_tolerant_policy": job.loss_tolerant_policy, "lane_bits": job.lane_bits,
            **({"slot_groups": list(job.slot_groups)} if job.slot_groups else {}),
            **({"racks": list(job.racks)} if job.racks else {}),
            "workers": [{"host": w.host, "port": w.port} for w in job.workers]}


# A job file without a rendezvous says so: its caller changes the epoch between runs (JobFile).
EPOCHS_CALLER = "caller"


@dataclass(frozen=True)
class JobFile:
    """What a launcher hands every worker of a job: the job and where its switch listens.

    On disk (JSON): {"switch": {"host": "127.0.0.1", "port": 47000}, "job": {<JobConfig fields,
    workers as [{"host", "port"}, ...] in rank order>}, "rendezvous": {"host", "port"},
    "communication": {"method": "topk", "ratio": 0.01, ...}}.
    Written by the launcher, read by each training process (host_agent.assignment.agent_from_env),
    so nobody copies ports by hand. `rendezvous` names the spina.rendezvous server that gives
    each run of the job its own epoch. A file on disk must name one, or say `"epochs":
    "caller"` instead (EPOCHS_CALLER): then every run uses the file's epoch, and the caller
    changes it between runs on a long-lived switch, or the second program gets the first's
    sums; a file with neither is refused, so that choice is never made by omission
    (rendezvous=None in code writes "epochs": "caller"). `communication` (optional,
    spina.communication.Communication) says which DDP hook every rank registers
    (host_agent.hooks.register_from_job); without it, dense SpINA. Votes need int32 lanes
    (Communication.check_lanes).
    """
    job: JobConfig
    switch: tuple[str, int]
    rendezvous: tuple[str, int] | None = None  # spina.rendezvous: where each run gets its epoch
    communication: Communication | None = None  # which DDP hook; None: dense

    def __post_init__(self):
        if self.communication is not None:
            self.communication.check_lanes(self.job.lane_bits)

    def to_dict(self) -> dict:
        d = {"switch": {"host": self.switch[0], "port": self.switch[1]},
             "job": job_to_dict(self.job)}
        if self.rendezvous is not None:
            d["rendezvous"] = {"host": self.rendezvous[0], "port": self.rendezvous[1]}
        else:
            d["epochs"] = EPOCHS_CALLER
        if self.communication is not None:
            d["communication"] = self.communication.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "JobFile":
        if not isinstance(d, dict):
            raise ConfigError("job file: top level must be an object with 'switch' and 'job'")
        for k in d:
            if k not in ("switch", "job", "rendezvous", "epochs", "communication"):
                raise ConfigError(f"job file: unknown field '{k}' "
                                  "(known: communication, epochs, job, rendezvous, switch)")
        if "epochs" in d and (d["epochs"] != EPOCHS_CALLER or "rendezvous" in d):
            raise ConfigError(f"job file: field 'epochs': {d['epochs']!r}: the only value is "
                              f"{EPOCHS_CALLER!r}, and only in a file without a 'rendezvous' "
                              "(whose epochs the rendezvous gives)")
        if "rendezvous" not in d and "epochs" not in d:
            raise ConfigError(
                "job file: field 'rendezvous' is missing: without it every run uses the "
                "file's epoch, and a second program on a long-lived switch gets the first "
                "one's sums. Name the rendezvous of the job's owner (`spina serve` and "
                "`python -m host_agent launch` write it), or say \"epochs\": \"caller\" if "
                "your program changes the job's epoch between runs")
        try:
            switch = _address(d.get("switch"), "switch")
            rendezvous = _address(d["rendezvous"], "rendezvous") if "rendezvous" in d else None
            communication = (Communication.from_dict(d["communication"])
                             if "communication" in d else None)
        except ConfigError as e:
            raise ConfigError(f"job file: {e}") from None
        if "job" not in d:
            raise ConfigError("job file: field 'job' is required")
        try:
            job = JobConfig.from_dict(d["job"])
        except ConfigError as e:
            raise ConfigError(f"job file: job: {e}") from None
        try:
            return cls(job, switch, rendezvous, communication)
        except ConfigError as e:  # the section against the job (check_lanes)
            raise ConfigError(f"job file: {e}") from None

    def write(self, path) -> None:
        """Atomically (write + rename): a reader never sees half a file."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "JobFile":
        return load_json(path, "job file", cls.from_dict)


@dataclass(frozen=True)
class Assignment:
    """One worker's job file: a JobFile plus the worker's rank, for a host agent that knows
    nothing but its file (the controller writes `agents_dir/job<ID>-rank<R>.json`).

        {"rank": 1, "switch": {"host": "127.0.0.1", "port": 47000},
         "job": {"job": 7, "epoch": 1, "slot_base": 0, "nslots": 16, "block_size": 256,
                 "nlanes": 56, "workers": [{"host": "127.0.0.1", "port": 50000}, ...], ...}}

    `host_agent.assignment.connect(path)` makes that worker's agent from it. A two-level
    job's file (its job has `racks`) also says, for the reader, the rank the worker's own
    switch knows it by and that switch's worker count ("switch_rank", "switch_ranks": derived
    from `rank` and the job's racks; a file that disagrees is rejected).
    """
    job: JobConfig
    rank: int
    switch: tuple[str, int]
    rendezvous: tuple[str, int] | None = None  # spina.rendezvous: each run's epoch
    communication: Communication | None = None  # as JobFile's

    def to_dict(self) -> dict:
        extra = ({"switch_rank": self.job.switch_rank(self.rank),
                  "switch_ranks": self.job.switch_ranks(self.rank)} if self.job.racks else {})
        return {"rank": self.rank, **extra, **self.job_file().to_dict()}

    def job_file(self) -> "JobFile":
        """What this worker reads from its assignment: a JobFile (one switch, its own)."""
        return JobFile(self.job, self.switch, self.rendezvous, self.communication)

    @classmethod
    def from_dict(cls, d: dict) -> "Assignment":
        if not isinstance(d, dict) or "rank" not in d:
            raise ConfigError("assignment: field 'rank' is missing")
        d = dict(d)
        rank = d.pop("rank")
        stated = {k: d.pop(k) for k in ("switch_rank", "switch_ranks") if k in d}
        jf = JobFile.from_dict(d)
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < jf.job.nworkers:
            raise ConfigError(f"assignment: field 'rank': {rank!r} outside "
                              f"0..{jf.job.nworkers - 1}")
        derived = {"switch_rank": jf.job.switch_rank(rank),
                   "switch_ranks": jf.job.switch_ranks(rank)}
        for k, v in stated.items():
            if v != derived[k] or isinstance(v, bool):
                raise ConfigError(f"assignment: field '{k}': {v!r}, but rank {rank} of racks "
                                  f"{list(jf.job.racks) or [jf.job.nworkers]} has {derived[k]}")
        return cls(jf.job, rank, jf.switch, jf.rendezvous, jf.communication)

    @classmethod
    def load(cls, path) -> "Assignment":
        return load_json(path, "assignment file", cls.from_dict)


def load_worker_file(path, rank: int) -> JobFile:
    """Rank `rank`'s job and switch from a job file (every rank, one switch) or from the
    controller's assignment file of that rank (a two-level job's ranks send to their own
    rack's leaf, so the controller writes one file per rank and no job file)."""
    def parse(d) -> JobFile:
        if not (isinstance(d, dict) and "rank" in d):
            return JobFile.from_dict(d)
        a = Assignment.from_dict(d)
        if a.rank != rank:
            raise ConfigError(f"assignment: field 'rank': the file is rank {a.rank}'s, "
                              f"this worker is rank {rank}")
        return a.job_file()
    return load_json(path, "job file", parse)


def write_if_changed(path, doc: dict) -> bool:
    """Write `doc` as JSON to `path` unless the file already says the same, atomically (a
    reader never sees half a file). True if the file changed."""
    path = pathlib.Path(path)
    text = json.dumps(doc, indent=1) + "\n"
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
    return True
