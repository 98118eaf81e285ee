"""The software switch's own files as desired states: its UDP mode's jobs (`from_udp_jobs`, the
`--jobs` file) and its L2 mode's config (`from_l2_config`, softswitch/README.md), so that
`python -m softswitch`, the testbed and the namespace tests program a software switch with the
controller's classes. Every error names the field.
"""
from __future__ import annotations

from controller.model import IN_PROCESS, NO_MAC, DesiredState, mac_address
from controller.state import parse
from spina import spec, wire
from spina.config import JOB_OPTIONS, ConfigError, JobConfig
from spina.fields import integer, need


def _one_switch(sw: dict, jobs: list[tuple[JobConfig, list[tuple[str, int]]]]) -> DesiredState:
    """A desired state of switch `sw` (its raw fields) running `jobs`, each with its workers'
    (MAC, switch port) in rank order. One worker per address, whatever its jobs."""
    workers: dict[tuple[str, int], dict] = {}
    raw_jobs = []
    for j, (job, attach) in enumerate(jobs):
        members = []
        for r, (w, (mac, port)) in enumerate(zip(job.workers, attach)):
            mine = {"name": f"{w.host}:{w.port}", "ip": w.host, "udp_port": w.port,
                    "mac": mac, "switch_port": port}
            seen = workers.setdefault((w.host, w.port), mine)
            need(seen == mine, f"jobs[{j}].workers[{r}]",
                  f"{w.host}:{w.port} is also a worker on port {seen['switch_port']} with MAC "
                  f"{seen['mac']}")
            members.append(mine["name"])
        raw_jobs.append({"id": job.job, "members": members,
                         **{k: getattr(job, k) for k in JOB_OPTIONS}})
    return parse({"switches": [sw], "workers": list(workers.values()), "jobs": raw_jobs})


def from_udp_jobs(jobs: list[JobConfig], *, address: str, udp_port: int, pool_slots: int,
                  slot_capacity: int) -> DesiredState:
    """A one-switch desired state from the UDP-mode software switch's jobs (its `--jobs` file):
    every worker on port 0, the UDP mode's one port (admitted by its source address); results
    go to each worker's address through the job's group and worker_rewrite, as on a P4 switch.
    Errors name the job by position and id (`jobs[1]: job 4: field 'block_size': ...`)."""
    for i, job in enumerate(jobs):
        try:
            job.validate(pool_slots, slot_capacity)
        except ConfigError as e:
            raise ConfigError(f"jobs[{i}]: {e}") from None  # e names the job and the field
    sw = {"name": "s1", "target": "softswitch", "grpc": IN_PROCESS, "address": address,
          "udp_port": udp_port, "pool_slots": pool_slots, "slot_capacity": slot_capacity,
          "ports": [0], "ina_endpoints": []}
    return _one_switch(sw, [(job, [(NO_MAC, 0)] * job.nworkers) for job in jobs])


L2_CONFIG_FIELDS = ("endpoints", "l2", "routes", "qdepth_threshold", "jobs", "mtu")


def from_l2_config(cfg, *, name: str = "s1", target: str = "softswitch", grpc: str = IN_PROCESS,
                   pool_slots: int = spec.P4_SIZES["POOL_SLOTS"],
                   slot_capacity: int = spec.DEFAULT_SLOT_CAPACITY, **switch) -> DesiredState:
    """A one-switch desired state from the software switch's L2 config (softswitch/README.md):

        {"endpoints": ["10.0.0.100"], "l2": [{"mac": "02:..", "port": 1}],
         "routes": [{"prefix": "10.1.0.0/16", "port": 3, "src_mac": "..", "dst_mac": ".."}],
         "qdepth_threshold": 64, "mtu": 1500,
         "jobs": [{JobConfig fields..., "workers": [{"host": "10.0.0.1", "port": 50000,
                                                     "mac": "..", "switch_port": 1}]}]}

    so that `python -m softswitch l2 --config` and the testbed program a switch with the
    controller's classes. `switch` holds further switch fields (thrift_port, p4info, ...).
    A job's full packets must fit the links' IP MTU (`mtu`, default 1500): frames, unlike UDP
    datagrams, are not fragmented for us. Errors name the field (ConfigError).
    """
    need(isinstance(cfg, dict), "switch config", "must be a mapping of fields")
    for k in cfg:
        need(k in L2_CONFIG_FIELDS, f"switch config: field '{k}'",
              f"unknown field (known: {', '.join(sorted(L2_CONFIG_FIELDS))})")
    for k in ("endpoints", "l2", "routes", "jobs"):
        need(isinstance(cfg.get(k, []), list), f"switch config: field '{k}'", "must be a list")
    for k in ("qdepth_threshold", "mtu"):
        if k in cfg:
            integer(cfg, k, "switch config", 0, 1 << 19)
    mtu = cfg.get("mtu", 1500)
    jobs, ports = [], set()
    for j, jd in enumerate(cfg.get("jobs", ())):
        where = f"switch config: jobs[{j}]"
        try:
            job = JobConfig.from_dict(jd)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        size = 20 + 8 + wire.packet_len(job.nlanes, job.block_size, job.nlanes)
        need(size <= mtu, f"{where}: field 'nlanes'",
              f"{job.nlanes} lanes of {job.block_size} elements make {size}-byte IP packets, "
              f"more than the MTU of {mtu}")
        attach = []
        for r, wd in enumerate(jd["workers"]):
            for k in ("mac", "switch_port"):
                need(k in wd, f"{where}.workers[{r}].{k}", "required in a switch config")
            attach.append((mac_address(wd, "mac", f"{where}.workers[{r}]"),
                           integer(wd, "switch_port", f"{where}.workers[{r}]", 0, 511)))
        ports.update(port for _, port in attach)
        jobs.append((job, attach))
    endpoints = cfg.get("endpoints", [])
    sw = {"name": name, "target": target, "grpc": grpc, "pool_slots": pool_slots,
          "slot_capacity": slot_capacity, "ina_endpoints": endpoints,
          "address": endpoints[0] if endpoints else "127.0.0.1",
          "l2": cfg.get("l2", []), "routes": cfg.get("routes", []),
          "drop_qdepth": cfg.get("qdepth_threshold"), **switch}
    for e in sw["l2"] + sw["routes"]:
        if isinstance(e, dict) and isinstance(e.get("port"), int):
            ports.add(e["port"])
        if isinstance(e, dict) and isinstance(e.get("ports"), list):
            ports.update(p for p in e["ports"] if isinstance(p, int))
    sw["ports"] = sorted(p for p in ports if 0 <= p < 512) or [0]
    try:
        return _one_switch(sw, jobs)
    except ConfigError as e:
        raise ConfigError(f"switch config: {e}") from None
