"""The desired state's model: one YAML file of switches, workers and jobs, validated here
(controller/state.py reads a file; controller/plan.py validates its `fabric:` section). Every
error names the offending field (`jobs[1].nslots: ...`).

    switches:
      - name: s1
        target: softswitch          # softswitch | bmv2 | tofino (P4Runtime; unverified)
        grpc: 127.0.0.1:9559        # P4Runtime server
        device_id: 0
        thrift_port: 9090           # bmv2 only: its register runtime
        address: 127.0.0.1          # the switch's INA endpoint IPv4 (agents send here)
        udp_port: 47000             # ... to this UDP port
        pool_slots: 256             # slots shared by the jobs on this switch
        slot_capacity: 16384        # softswitch: elements per slot (its --slot-capacity)
        ports: [0]                  # switch ports workers may sit on (UDP mode: port 0)
        p4info: p4src/build/spina_v1model.p4info.txtpb   # optional: default spec.p4info()
        device_config: p4src/build/spina_v1model.json    # optional (bmv2: required)
                                    # tofino: bf-p4c's output directory (required)
        api: p4runtime              # tofino only: p4runtime (default) | bfrt (the SDE's BF
                                    # Runtime gRPC server in bf_switchd: controller/bfrt.py)
        device_config_format: stratum   # tofino, api p4runtime (required): stratum | bf_switchd
        lane_bits: 32               # tofino only: the lane width the TNA program was compiled
                                    # for (bf-p4c -DSPINA_LANE_BITS=16|8; default 32); its jobs
                                    # must have this lane_bits (tofino/README.md, "Narrow lanes")
        l2: [{mac: "02:..", port: 1}]                     # optional extra forwarding
            # or {mac: "02:..", ports: [3, 4]}: sprayed per packet, round-robin over the ports
            # (v1model only: l2's spray and spray_ports, p4src/v1model/forwarding.p4)
        routes: [{prefix: 10.1.0.0/16, port: 3, src_mac: "..", dst_mac: ".."}]
    workers:
      - {name: w0, ip: 127.0.0.1, udp_port: 50000, switch_port: 0, mac: "02:00:00:00:01:00"}
    jobs:
      - id: 7
        members: [w0, w1]           # rank = position in this list
        nslots: 16                  # the job's share of the slot pool ...
        slot_base: 0                # ... from here (allocated first-fit when absent)
        block_size: 256
        nlanes: 56
        epoch: 1
        priority: 0                 # egress queue 0..7
        drop_qdepth: 64             # optional: drop loss-tolerant packets above this depth
        bounded_loss: 0.0           # optional, agents only: DLCP bounded-loss mode (JobConfig)
        loss_deadline: 0.05         # seconds, or auto: twice the measured round latency
        priority_policy: fixed      # optional, agents only: fixed | layer (host_agent/dlcp.py)
        loss_tolerant_policy: none  # optional, agents only: none | magnitude (needs bounded_loss)
        lane_bits: 32               # optional: 32 | 16 | 8, a float value's width on the wire
    agents_dir: agents              # where the controller writes the agents' files
    rendezvous: 127.0.0.1:47100     # where agents join each run (default 127.0.0.1:47100):
                                    # `serve` gives every run of a job a new epoch there

Relative paths are relative to the YAML file. A worker may give `rank`; it must then equal its
position in the members of every job it belongs to.
"""
from __future__ import annotations

import ipaddress
import pathlib
from dataclasses import dataclass, field, make_dataclass, replace

import yaml

from controller.tofino import FORMATS as TOFINO_FORMATS
from spina import spec, wire
from spina.config import (
    JOB_FIELDS,
    JOB_OPTIONS,
    JOB_SHARED_OPTIONS,
    ConfigError,
    JobConfig,
    WorkerAddr,
    job_options,
)
from spina.fields import integer, mapping, need, optional_list, string
from spina.rendezvous import DEFAULT_ADDRESS as DEFAULT_RENDEZVOUS

TARGETS = ("softswitch", "bmv2", "tofino")
APIS = ("p4runtime", "bfrt")  # a tofino switch's control API: P4Runtime, or the SDE's BF Runtime
NO_MAC = "00:00:00:00:00:00"
IN_PROCESS = "in-process"  # grpc of a switch the controller reaches through `connect` only


def _spray_ports(e: dict, where: str) -> tuple[int, ...]:
    """An l2 entry's `ports`: the spray group's ports in turn order, distinct, 0..511."""
    ports = e["ports"]
    need(isinstance(ports, list) and 1 <= len(ports) <= spec.MAX_SPRAY_WAYS, f"{where}.ports",
          f"must be a list of 1..{spec.MAX_SPRAY_WAYS} port numbers, got {ports!r}")
    for i, p in enumerate(ports):
        need(isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 511,
              f"{where}.ports[{i}]", f"must be a port number 0..511, got {p!r}")
    twice = [p for p in ports if ports.count(p) > 1]
    need(not twice, f"{where}.ports", f"duplicate port {twice[0] if twice else ''}")
    return tuple(ports)


def _ipv4(d: dict, key: str, where: str) -> str:
    v = d[key]
    try:
        need(isinstance(v, str), f"{where}.{key}", f"not an IPv4 address: {v!r}")
        return str(ipaddress.IPv4Address(v))
    except ValueError:
        raise ConfigError(f"{where}.{key}: not an IPv4 address: {v!r}") from None


def mac_address(d: dict, key: str, where: str, default=None) -> str:
    v = d.get(key, default)
    need(isinstance(v, str), f"{where}.{key}",
          f"not a MAC address aa:bb:cc:dd:ee:ff (quote it in YAML): {v!r}")
    parts = v.split(":")
    need(len(parts) == 6 and all(len(p) == 2 for p in parts), f"{where}.{key}",
          f"not a MAC address aa:bb:cc:dd:ee:ff: {v!r}")
    try:
        [int(p, 16) for p in parts]
    except ValueError:
        raise ConfigError(f"{where}.{key}: not a MAC address: {v!r}") from None
    return str(v).lower()


@dataclass(frozen=True)
class Switch:
    name: str
    target: str
    grpc: str
    device_id: int = 0
    thrift_port: int = 9090
    address: str = "127.0.0.1"
    udp_port: int = wire.DEFAULT_UDP_PORT
    pool_slots: int = spec.P4_SIZES["POOL_SLOTS"]
    slot_capacity: int = spec.DEFAULT_SLOT_CAPACITY
    ports: tuple[int, ...] = (0,)
    p4info: str | None = None
    device_config: str | None = None
    device_config_format: str | None = None  # tofino, api p4runtime: controller.tofino.FORMATS
    api: str = "p4runtime"  # tofino: APIS, how the controller talks to the switch
    lane_bits: int = 32  # tofino: the width its TNA program serves (tofino/size.p4 SPINA_LANE_BITS)
    l2: tuple[tuple[str, int], ...] = ()
    l2_spray: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (mac, ports in turn order)
    routes: tuple[tuple[str, int, str, str], ...] = ()
    ina_endpoints: tuple[str, ...] | None = None  # None: (address,)
    drop_qdepth: int | None = None

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The addresses the switch aggregates INA packets for (ina_endpoint entries)."""
        return (self.address,) if self.ina_endpoints is None else self.ina_endpoints


@dataclass(frozen=True)
class Worker:
    name: str
    ip: str
    udp_port: int
    switch_port: int
    mac: str = NO_MAC
    switch: str = ""
    rank: int | None = None


def _options(self) -> dict:
    """These fields as JobConfig keyword arguments (every level of a job shares them)."""
    return {k: getattr(self, k) for k in JOB_SHARED_OPTIONS}


# The job options every level of a desired-state job (flat or of a fabric plan) shares with
# spina.config.JobConfig, made from its declaration (JOB_SHARED_OPTIONS: types and defaults
# included), so a new JobConfig option is a field here too; plus the switch-side drop threshold.
JobOptions = make_dataclass(
    "JobOptions",
    [(k, JOB_FIELDS[k].type, field(default=JOB_FIELDS[k].default)) for k in JOB_SHARED_OPTIONS]
    + [("drop_qdepth", "int | None", field(default=None))],
    namespace={"options": _options}, frozen=True, kw_only=True)
JobOptions.__module__ = __name__


@dataclass(frozen=True)
class Job(JobOptions):
    """A flat job of the desired state: its members (rank = position), its share of the slot
    pool and the JobOptions."""
    id: int
    members: tuple[str, ...]
    nslots: int
    slot_base: int | None = None

    @property
    def mcast_grp(self) -> int:
        return spec.mcast_grp(self.id)

    def rid(self, rank: int) -> int:
        return spec.rid(self.id, rank)

    @property
    def slots(self) -> range:
        return range(self.slot_base, self.slot_base + self.nslots)


@dataclass
class DesiredState:
    switches: dict[str, Switch]
    workers: dict[str, Worker]
    jobs: dict[int, Job]
    agents_dir: str = "agents"
    path: pathlib.Path | None = None
    raw: dict = field(default_factory=dict, repr=False)
    # The spina.rendezvous server of `controller serve`: every agent file names it, so every
    # run of a job (flat or fabric) gets a new epoch, never another run's sums.
    rendezvous: tuple[str, int] = DEFAULT_RENDEZVOUS
    # controller.plan.Fabric: the `fabric:` section (leaf/spine jobs), if any; it points back here
    fabric: object = field(default=None, repr=False, compare=False)
    # The parser that read this state (controller.state.parse: flat and fabric sections), so
    # that a changed copy (with_job, without_job) is read the same way
    parser: object = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------ views
    def switch_of(self, job: Job) -> Switch:
        return self.switches[self.workers[job.members[0]].switch]

    def jobs_on(self, sw: Switch) -> list[Job]:
        return sorted((j for j in self.jobs.values() if self.switch_of(j).name == sw.name),
                      key=lambda j: j.id)

    def workers_on(self, sw: Switch) -> list[Worker]:
        return [w for w in self.workers.values() if w.switch == sw.name]

    def job_config(self, job: Job) -> JobConfig:
        """The job as the switch pipeline and the host agents see it."""
        workers = tuple(WorkerAddr(r, self.workers[m].ip, self.workers[m].udp_port)
                        for r, m in enumerate(job.members))
        return JobConfig(job=job.id, slot_base=job.slot_base, nslots=job.nslots,
                         **job.options(), workers=workers)

    def resolve(self, p: str | None) -> pathlib.Path | None:
        if p is None:
            return None
        q = pathlib.Path(p)
        return q if q.is_absolute() or self.path is None else self.path.parent / q

    # ------------------------------------------------------------ edits (job add / remove)
    def with_job(self, job: Job) -> "DesiredState":
        """A copy with `job` added (slot_base allocated first-fit if None); validated."""
        need(job.id not in self.jobs, f"jobs[id={job.id}].id", "a job with this id exists")
        raw = dict(self.raw)
        jd = {"id": job.id, "members": list(job.members), "nslots": job.nslots,
              "slot_base": self.allocate(job) if job.slot_base is None else job.slot_base,
              **job.options()}
        if job.drop_qdepth is not None:
            jd["drop_qdepth"] = job.drop_qdepth
        raw["jobs"] = list(raw.get("jobs") or []) + [jd]
        return (self.parser or parse_flat)(raw, self.path)

    def with_epoch(self, job_id: int, epoch: int) -> "DesiredState":
        """A copy whose job `job_id`, flat or of the fabric plan, runs with `epoch` (a run
        started by `controller serve`; the file keeps its own epoch)."""
        if job_id in self.jobs:
            jobs = dict(self.jobs)
            jobs[job_id] = replace(jobs[job_id], epoch=epoch)
            return replace(self, jobs=jobs)
        need(self.fabric is not None and job_id in self.fabric.jobs, "jobs",
              f"no job {job_id} in the desired state")
        fjobs = dict(self.fabric.jobs)
        fjobs[job_id] = replace(fjobs[job_id], epoch=epoch)
        fabric = replace(self.fabric, jobs=fjobs)
        state = replace(self, fabric=fabric)
        fabric.state = state
        return state

    def every_job(self) -> list:
        """Every job by id: the flat ones (Job) and the fabric plan's (plan.FabricJob)."""
        jobs = list(self.jobs.values()) + list(self.fabric.jobs.values() if self.fabric else ())
        return sorted(jobs, key=lambda j: j.id)

    def run_jobs(self) -> dict[int, tuple[int, int]]:
        """{job: (worker count, epoch)} of every job, flat or of the fabric plan: what the
        run rendezvous serves."""
        out = {j.id: (len(j.members), j.epoch) for j in self.jobs.values()}
        if self.fabric is not None:
            out.update({j.id: (len(self.fabric.members(j)), j.epoch)
                        for j in self.fabric.jobs.values()})
        return out

    def job_switches(self, job_id: int) -> list[str]:
        """The switches that admit job `job_id`: a flat job's one switch; a fabric job's
        spines (of its shards) first, then its racks' leaves."""
        if job_id in self.jobs:
            return [self.switch_of(self.jobs[job_id]).name]
        job = self.fabric.jobs[job_id]
        spines = list(dict.fromkeys(s.spine for s in job.shards))
        return spines + [self.fabric.racks[r].leaf for r in job.racks]

    def without_job(self, job_id: int) -> "DesiredState":
        need(job_id in self.jobs, "id", f"no job {job_id} in the desired state")
        raw = dict(self.raw)
        raw["jobs"] = [j for j in raw.get("jobs") or [] if j.get("id") != job_id]
        return (self.parser or parse_flat)(raw, self.path)

    def allocate(self, job: Job) -> int:
        """The lowest slot_base where `job.nslots` slots are free on its switch."""
        need(job.members and job.members[0] in self.workers, "members",
              f"unknown worker {job.members[0] if job.members else None!r}")
        sw = self.switches[self.workers[job.members[0]].switch]
        used = sorted((j.slot_base, j.slot_base + j.nslots) for j in self.jobs_on(sw))
        base = 0
        for lo, hi in used:
            if base + job.nslots <= lo:
                break
            base = max(base, hi)
        need(base + job.nslots <= sw.pool_slots, "nslots",
              f"{job.nslots} free slots not found on switch {sw.name} "
              f"(pool of {sw.pool_slots}, in use: {used})")
        return base

    def save(self, path: pathlib.Path | None = None) -> None:
        path = path or self.path
        text = yaml.safe_dump(self.raw, sort_keys=False, default_flow_style=None)
        tmp = pathlib.Path(str(path) + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def load_yaml(path, parser) -> DesiredState:
    """The desired state in the YAML file `path`, parsed by `parser(doc, path)` (controller.state
    .parse: flat and fabric); every error names the file."""
    path = pathlib.Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML: {e}") from None
    try:
        return parser(doc, path)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def parse_flat(doc, path: pathlib.Path | None = None) -> DesiredState:
    """The switches, workers and flat jobs of `doc` (a YAML document), validated; ConfigError
    names the field. A `fabric:` section is kept in `raw` for controller/plan.py."""
    mapping(doc, "(top)", {"switches", "workers"}, {"jobs", "agents_dir", "rendezvous",
                                                   "fabric"})
    need(isinstance(doc["switches"], list) and doc["switches"], "switches",
          "must be a non-empty list")
    switches: dict[str, Switch] = {}
    for i, d in enumerate(doc["switches"]):
        sw = _parse_switch(d, f"switches[{i}]", switches)
        switches[sw.name] = sw
    need(isinstance(doc["workers"], list), "workers", "must be a list")
    workers: dict[str, Worker] = {}
    for i, d in enumerate(doc["workers"]):
        wk = _parse_worker(d, f"workers[{i}]", switches, workers)
        workers[wk.name] = wk
    jobs: dict[int, Job] = {}
    jobs_doc = doc.get("jobs") or []
    need(isinstance(jobs_doc, list), "jobs", "must be a list")
    for i, d in enumerate(jobs_doc):
        job = _parse_job(d, f"jobs[{i}]", switches, workers, jobs)
        jobs[job.id] = job
    agents_dir = doc.get("agents_dir", "agents")
    need(isinstance(agents_dir, str) and agents_dir, "agents_dir", "must be a path")
    rendezvous = (_host_port(doc["rendezvous"], "rendezvous") if "rendezvous" in doc
                  else DEFAULT_RENDEZVOUS)
    return DesiredState(switches, workers, jobs, agents_dir, path, raw=doc, rendezvous=rendezvous)


def _parse_switch(d, w: str, switches: dict[str, Switch]) -> Switch:
    """The switch `d` (named `w`, e.g. "switches[0]" in errors), not one of `switches`."""
    mapping(d, w, {"name", "target", "grpc"},
            {"device_id", "thrift_port", "address", "udp_port", "pool_slots", "ports",
             "slot_capacity", "p4info", "device_config", "device_config_format", "l2",
             "routes", "ina_endpoints", "drop_qdepth", "lane_bits", "api"})
    name = string(d, "name", w)
    need(name not in switches, f"{w}.name", f"duplicate switch {name!r}")
    need(d["target"] in TARGETS, f"{w}.target", f"must be one of {', '.join(TARGETS)}")
    host, sep, port = string(d, "grpc", w).rpartition(":")
    need(d["grpc"] == IN_PROCESS or
          (sep and port.isdigit() and 0 < int(port) < 1 << 16 and host), f"{w}.grpc",
          f"expected HOST:PORT with a TCP port 1..65535, got {d['grpc']!r}")
    endpoints = None
    if d.get("ina_endpoints") is not None:
        endpoints = tuple(_ipv4({f"ina_endpoints[{k}]": a}, f"ina_endpoints[{k}]", w)
                          for k, a in enumerate(optional_list(d, "ina_endpoints", w)))
    ports = d.get("ports", [0])
    need(isinstance(ports, list) and ports and all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 512 for p in ports),
          f"{w}.ports", "must be a non-empty list of port numbers 0..511")
    for k in ("p4info", "device_config"):
        if d.get(k) is not None:
            string(d, k, w)
    l2, l2_spray = _switch_l2(d, w)
    routes = _switch_routes(d, w)
    _switch_target(d, w)
    return Switch(
        name=name, target=d["target"], grpc=d["grpc"],
        device_id=integer(d, "device_id", w, 0, (1 << 64) - 1, 0),
        thrift_port=integer(d, "thrift_port", w, 1, 65535, 9090),
        address=_ipv4({"address": d.get("address", "127.0.0.1")}, "address", w),
        udp_port=integer(d, "udp_port", w, 1, 65535, wire.DEFAULT_UDP_PORT),
        pool_slots=integer(d, "pool_slots", w, 1, 1 << 15, spec.P4_SIZES["POOL_SLOTS"]),
        slot_capacity=integer(d, "slot_capacity", w, 1, 1 << 24, spec.DEFAULT_SLOT_CAPACITY),
        ports=tuple(ports), p4info=d.get("p4info"), device_config=d.get("device_config"),
        device_config_format=d.get("device_config_format"),
        api=d.get("api", "p4runtime"),
        lane_bits=d.get("lane_bits", 32),
        l2=tuple(l2), l2_spray=tuple(l2_spray), routes=tuple(routes),
        ina_endpoints=endpoints,
        drop_qdepth=integer(d, "drop_qdepth", w, 0, spec.QDEPTH_NEVER)
        if d.get("drop_qdepth") is not None else None)


def _switch_l2(d: dict, w: str) -> tuple[list, list]:
    """A switch's extra forwarding: (bridged (mac, port)s, sprayed (mac, ports)s)."""
    l2, l2_spray = [], []
    for k, e in enumerate(optional_list(d, "l2", w)):
        wk = f"{w}.l2[{k}]"
        mapping(e, wk, {"mac"}, {"port", "ports"})
        need(("port" in e) != ("ports" in e), f"{wk}.ports" if "ports" in e else f"{wk}.port",
              "give either port (bridged) or ports (sprayed per packet), not both"
              if "ports" in e else "required field is missing (or ports)")
        if "port" in e:
            l2.append((mac_address(e, "mac", wk), integer(e, "port", wk, 0, 511)))
        else:
            l2_spray.append((mac_address(e, "mac", wk), _spray_ports(e, wk)))
    need(len({ports for _, ports in l2_spray}) <= spec.P4_SIZES["SPRAY_GROUPS"], f"{w}.l2",
          f"at most {spec.P4_SIZES['SPRAY_GROUPS']} different ports lists (spray groups)")
    need(sum(len(g) for g in {ports for _, ports in l2_spray})
          <= spec.P4_SIZES["SPRAY_PORT_ENTRIES"], f"{w}.l2",
          f"the different ports lists hold more than {spec.P4_SIZES['SPRAY_PORT_ENTRIES']} "
          "ports in all (spray_ports entries)")
    return l2, l2_spray


def _switch_routes(d: dict, w: str) -> list[tuple[str, int, str, str]]:
    """A switch's IPv4 routes: (prefix, port, src_mac, dst_mac)."""
    routes = []
    for k, e in enumerate(optional_list(d, "routes", w)):
        wk = f"{w}.routes[{k}]"
        mapping(e, wk, {"prefix", "port", "src_mac", "dst_mac"}, set())
        try:
            net = str(ipaddress.IPv4Network(string(e, "prefix", wk), strict=False))
        except ValueError:
            raise ConfigError(f"{wk}.prefix: not an IPv4 prefix: {e['prefix']!r}") from None
        routes.append((net, integer(e, "port", wk, 0, 511), mac_address(e, "src_mac", wk),
                       mac_address(e, "dst_mac", wk)))
    return routes


def _switch_target(d: dict, w: str) -> None:
    """The fields a switch's target needs, and none that only another target takes."""
    if d["target"] != "softswitch":
        need(d.get("udp_port", spec.INA_UDP_PORT) == spec.INA_UDP_PORT, f"{w}.udp_port",
              f"a {d['target']} switch parses INA packets on UDP port {spec.INA_UDP_PORT} "
              f"only, got {d.get('udp_port')!r}")
    if d["target"] == "bmv2":
        need("p4info" in d and "device_config" in d, f"{w}.device_config",
              "bmv2 needs p4info and device_config (make p4 writes them to p4src/build/)")
    if d["target"] != "tofino":
        for k in ("device_config_format", "lane_bits", "api"):
            need(k not in d, f"{w}.{k}", "only for target tofino")
        return
    for k in ("p4info", "device_config"):
        need(d.get(k) is not None, f"{w}.{k}", "required for target tofino (P4Info "
              "from bf-p4c --p4runtime-force-std-externs; device_config: bf-p4c's "
              "output directory)")
    need(d.get("api", "p4runtime") in APIS, f"{w}.api",
          f"must be one of {', '.join(APIS)} (P4Runtime, or the SDE's BF Runtime gRPC "
          f"server), got {d.get('api')!r}")
    if d.get("api", "p4runtime") == "p4runtime":
        need(d.get("device_config_format") in TOFINO_FORMATS,
              f"{w}.device_config_format",
              f"must be one of {', '.join(TOFINO_FORMATS)} (the P4Runtime server: "
              f"Stratum or the SDE's bf_switchd), got {d.get('device_config_format')!r}")
    else:  # BF Runtime carries bf-p4c's files in its own message: one format
        need("device_config_format" not in d, f"{w}.device_config_format",
              "only for api p4runtime (BF Runtime takes bf-p4c's files as they are)")
    need(d.get("lane_bits", 32) in wire.LANE_BITS, f"{w}.lane_bits",
          f"must be one of {', '.join(map(str, wire.LANE_BITS))} (the TNA program's "
          f"SPINA_LANE_BITS), got {d.get('lane_bits')!r}")


def _parse_worker(d, w: str, switches: dict[str, Switch], workers: dict[str, Worker]) -> Worker:
    """The worker `d` (named `w` in errors) on one of `switches`, its name and address not
    those of any of `workers`."""
    mapping(d, w, {"name", "ip", "udp_port", "switch_port"}, {"mac", "switch", "rank"})
    name = string(d, "name", w)
    need(name not in workers, f"{w}.name", f"duplicate worker {name!r}")
    sw = d.get("switch", next(iter(switches)) if len(switches) == 1 else None)
    need(isinstance(sw, str) and sw in switches, f"{w}.switch",
          f"must name one of the switches ({', '.join(switches)})")
    port = integer(d, "switch_port", w, 0, 511)
    need(port in switches[sw].ports, f"{w}.switch_port",
          f"port {port} is not in switch {sw}'s ports {list(switches[sw].ports)}")
    ip = _ipv4(d, "ip", w)
    udp = integer(d, "udp_port", w, 1, 65535)
    other = next((o.name for o in workers.values() if (o.ip, o.udp_port) == (ip, udp)), None)
    need(other is None, f"{w}.udp_port", f"{ip}:{udp} is also worker {other!r}'s address")
    if switches[sw].target != "softswitch":
        need("mac" in d, f"{w}.mac", f"required on a {switches[sw].target} switch")
    return Worker(name, ip, udp, port, mac_address(d, "mac", w, NO_MAC), sw,
                  integer(d, "rank", w, 0, wire.MAX_WORKERS - 1) if "rank" in d else None)


def _parse_job(d, w: str, switches: dict[str, Switch], workers: dict[str, Worker],
               jobs: dict[int, Job]) -> Job:
    """The flat job `d` (named `w` in errors): its members among `workers`, all on one switch,
    whose program it fits, its slots overlapping none of `jobs` there."""
    mapping(d, w, {"id", "members", "nslots"}, set(JOB_OPTIONS) | {"drop_qdepth"})
    jid = integer(d, "id", w, 0, spec.MAX_JOB_ID)
    need(jid not in jobs, f"{w}.id", f"duplicate job id {jid}")
    members = d["members"]
    need(isinstance(members, list) and 1 <= len(members) <= wire.MAX_WORKERS,
          f"{w}.members", f"must list 1..{wire.MAX_WORKERS} worker names")
    for r, m in enumerate(members):
        need(isinstance(m, str) and m in workers, f"{w}.members[{r}]", f"unknown worker {m!r}")
        wk = workers[m]
        need(wk.rank is None or wk.rank == r, f"{w}.members[{r}]",
              f"worker {m!r} declares rank {wk.rank} but is member {r} (rank = position)")
    need(len(set(members)) == len(members), f"{w}.members", "a worker is listed twice")
    sws = {workers[m].switch for m in members}
    need(len(sws) == 1, f"{w}.members", f"members sit on several switches {sorted(sws)}: "
          "a job aggregates on one switch")
    try:
        options = job_options(d)
    except ConfigError as e:
        raise e.at(w) from None
    job = Job(id=jid, members=tuple(members), **options,
              drop_qdepth=integer(d, "drop_qdepth", w, 0, spec.QDEPTH_NEVER)
              if "drop_qdepth" in d else None)
    need(job.slot_base is not None, f"{w}.slot_base",
          "required in the file (`job add` allocates it for you)")
    sw = switches[next(iter(sws))]
    need(job.slot_base + job.nslots <= sw.pool_slots, f"{w}.nslots",
          f"slots {job.slot_base}..{job.slot_base + job.nslots - 1} exceed switch "
          f"{sw.name}'s pool of {sw.pool_slots}")
    fits_program(job, sw, w)
    try:
        JobConfig(job=jid, workers=tuple(WorkerAddr(r, workers[m].ip, workers[m].udp_port)
                                         for r, m in enumerate(members)),
                  slot_base=job.slot_base, nslots=job.nslots, **job.options()).validate(
                      sw.pool_slots, sw.slot_capacity if sw.target == "softswitch" else None)
    except ConfigError as e:
        raise e.at(w) from None
    for other in jobs.values():
        if workers[other.members[0]].switch == sw.name and \
                job.slot_base < other.slot_base + other.nslots and \
                other.slot_base < job.slot_base + job.nslots:
            raise ConfigError(f"{w}.slot_base: slots {job.slot_base}.."
                              f"{job.slot_base + job.nslots - 1} overlap job {other.id}'s "
                              f"{other.slot_base}..{other.slot_base + other.nslots - 1}")
    return job


def fits_program(job: JobOptions, sw: Switch, where: str) -> None:
    """Refuse (ConfigError naming `where`'s field) a job, flat or of the fabric plan, that the
    P4 program `sw` runs cannot hold: a P4 target's block size and lane count (spec.P4_SIZES,
    spec.TNA_SIZES) and a TNA program's one lane width. The software switch holds any (its
    slot capacity is JobConfig.validate's)."""
    if sw.target == "softswitch":
        return
    sizes = spec.TNA_SIZES if sw.target == "tofino" else spec.P4_SIZES
    need(job.block_size == sizes["BLOCK_SIZE"], f"{where}.block_size",
          f"the {sw.target} P4 program aggregates blocks of {sizes['BLOCK_SIZE']}")
    need(job.nlanes <= sizes["NLANES"], f"{where}.nlanes",
          f"the {sw.target} P4 program has {sizes['NLANES']} lanes")
    if sw.target == "tofino":
        need(job.lane_bits == sw.lane_bits, f"{where}.lane_bits",
              f"{job.lane_bits}-bit lanes on switch {sw.name!r}, whose TNA program serves "
              f"{sw.lane_bits}-bit lanes only (its lane_bits; one program holds one width "
              "and takes a packet of another as malformed: tofino/README.md, 'Narrow lanes')")


def _host_port(v, where: str) -> tuple[str, int]:
    """'IPV4:PORT' as (host, port); the host must be an address, not a name or a wildcard."""
    host, sep, port = v.rpartition(":") if isinstance(v, str) else ("", "", "")
    need(sep and port.isdigit() and 0 < int(port) < 1 << 16, where,
          f"{v!r}: expected IPV4:PORT, e.g. 127.0.0.1:47100")
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise ConfigError(f"{where}: {host!r} is not an IPv4 address") from None
    need(not addr.is_unspecified, where, f"{host}: a wildcard address; give the address the "
          "agents reach the controller at")
    return host, int(port)


# ---------------------------------------------------------------- the software switch's own files
