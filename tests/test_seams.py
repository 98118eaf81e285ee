"""The seams matrix (issue 26): every way of running a switch x every job shape x a program's
first run, its second run, a run after a worker was killed and a run after a switch restart:
every rank of every job gets numpy's sum (int32 exact, float32 within the quantization bound
and bit-identical on every rank), or a one-line refusal naming what is not supported.

Run just these tests:  .venv/bin/python -m pytest tests/test_seams.py

Modes: `inprocess` (UDP-mode software switches in this process, programmed by a controller in
this process through their own P4Runtime servicers, which also owns the runs), `plan`
(`python -m softswitch udp --plan FILE --switch NAME` per switch, `python -m controller serve`),
`grpc` (`python -m softswitch udp --grpc` per switch, `controller serve` programs them). Every
program is one process per rank (tests/run_worker.py) taking its agent from the assignment file
the controller wrote, as a user's program does. The L2 mode and BMv2 meet the same phases and shapes
with a switch process per leaf and spine on the ports of the shape's topology file
(bench/topologies/seams_*.yaml, built by spina/netgraph.py's Graph: the namespaced hosts' veths
and the leaf-spine links; `python -m softswitch l2 --grpc`, `simple_switch_grpc --no-p4`;
`controller serve` answering the rendezvous on a management bridge; BMv2 skips, saying why,
where p4c and BMv2 are not installed). The mininet testbed's two-level networks meet them with
`controller serve` on the testbed's desired state (mininet and root, or BMv2, else a skip
saying why).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale_out import spine_hosts
from controller.controller import Controller, program_in_process
from controller.p4rt import Connection
from softswitch.udp import UdpSwitch
from spina import spec
from spina.net import free_port, free_ports
from tests.deployment import ENV, ROOT, Deployment, jobs_of
from tests.netns import MGMT_IP, TAG, managed_network, management_bridge

WORKER = ("-m", "tests.run_worker")  # run from ROOT (cwd=ROOT)
HOST = "127.0.0.1"
CALLS = 2  # an int32 call, then a float32 call (run_worker.tensor)
# s: the others' call that a killed rank never joins fails after this long without progress.
# Any wait fails it; waiting the run's whole timeout (8 s) cost each of the 23 rows 6 s more.
KILLED_WAIT = 2


# ---------------------------------------------------------------- job shapes
def shape_doc(racks: tuple[int, ...] = (), spines: int = 0, flat: int = 0) -> dict:
    """A desired state: a fabric job 7 over `racks` (worker counts) and `spines` if racks
    are given, and a flat job 3 of `flat` workers (on leaf0 beside the fabric job, or on a
    switch of its own). Every switch a UDP-mode software switch on loopback."""
    names = [f"leaf{i}" for i in range(len(racks))] + [f"spine{j}" for j in range(spines)]
    names = names or ["s0"]
    udp, grpc = free_ports(len(names)), free_ports(len(names) + 1)
    nw = sum(racks) + flat
    wports = free_ports(nw)
    # A spine listens on the INA port at an address of its own (controller/plan.py).
    where = {f"spine{j}": (a, spec.INA_UDP_PORT) for j, a in enumerate(spine_hosts(spines))}
    switches = [{"name": n, "target": "softswitch", "grpc": f"{HOST}:{g}",
                 "address": where.get(n, (HOST, u))[0], "udp_port": where.get(n, (HOST, u))[1]}
                for n, u, g in zip(names, udp, grpc)]
    workers, k = [], 0
    for i, size in enumerate(racks):
        for _ in range(size):
            workers.append({"name": f"w{k}", "ip": HOST, "udp_port": wports[k],
                            "switch_port": 0, "switch": f"leaf{i}"})
            k += 1
    for j in range(flat):
        workers.append({"name": f"f{j}", "ip": HOST, "udp_port": wports[k + j],
                        "switch_port": 0, "switch": names[0]})
    doc = {"switches": switches, "workers": workers, "agents_dir": "agents",
           "rendezvous": f"{HOST}:{grpc[-1]}", "jobs": []}
    if flat:  # beside the fabric job on leaf0: slots after the fabric job's
        doc["jobs"].append({"id": 3, "members": [f"f{j}" for j in range(flat)], "nslots": 4,
                            "slot_base": 4 if racks else 0, "block_size": 256, "nlanes": 8})
    if racks:
        first, rack_docs = 0, []
        for i, size in enumerate(racks):
            rack_docs.append({"name": f"r{i}", "leaf": f"leaf{i}",
                              "workers": [f"w{first + m}" for m in range(size)]})
            first += size
        share = 4 // spines
        doc["fabric"] = {
            "racks": rack_docs, "spines": [f"spine{j}" for j in range(spines)],
            "jobs": [{"id": 7, "racks": [r["name"] for r in rack_docs], "slot_base": 0,
                      "nslots": 4, "block_size": 256, "nlanes": 8,
                      "shards": [{"spine": f"spine{j}", "slot_base": j * share,
                                  "nslots": share} for j in range(spines)]}]}
    return doc


SHAPES = {  # name -> (shape_doc arguments, the switch restarted in the last phase)
    "flat": (dict(flat=3), "s0"),
    "fabric-2racks-1spine": (dict(racks=(2, 2), spines=1), "spine0"),
    "fabric-3racks-2spines": (dict(racks=(2, 1, 2), spines=2), "leaf1"),
    "flat-beside-fabric": (dict(racks=(2, 2), spines=1, flat=2), "leaf0"),
}


def run_program(dep: Deployment, seed: int, die: dict[int, int] | None = None,
                timeout: float = 30, where=None,
                length: int = 50_000) -> dict[int, list[tuple[int, dict | str]]]:
    """Every rank of every job as its own process at once; {job: [(exit code, its JSON or
    its last output lines)] by rank}. die: {job: rank} killed after its first call, the
    job's other ranks failing their second call after KILLED_WAIT seconds without progress.
    where(job, rank): the command that runs a rank's process elsewhere (a namespace);
    length: elements per tensor."""
    procs = {}
    for job, n in jobs_of(dep.doc).items():
        for r in range(n):
            extra = []
            if job in (die or {}):
                extra = ["--later-timeout", str(KILLED_WAIT)]
                if die[job] == r:
                    extra += ["--die-after", "1"]
            procs[(job, r)] = subprocess.Popen(
                [*(where(job, r) if where else ()), sys.executable, *WORKER,
                 "--via", "assignment", str(dep.agent_file(job, r)), "--rank", str(r),
                 "--value", "0", "--seed", str(seed), "--nranks", str(n),
                 "--calls", str(CALLS), "--timeout", str(timeout), "--length", str(length),
                 *extra],
                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: dict[int, list] = {}
    try:
        for (job, _), p in procs.items():
            o, e = p.communicate(timeout=120)
            got = json.loads(o.strip().splitlines()[-1]) if p.returncode == 0 else e[-600:]
            out.setdefault(job, []).append((p.returncode, got))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def assert_exact(results: dict[int, list]) -> None:
    """Every rank exited 0; int32 sums exact; float32 within the bound and bit-identical."""
    for job, ranks in results.items():
        for r, (code, got) in enumerate(ranks):
            assert code == 0, f"job {job} rank {r} failed: {got}"
        for call in range(CALLS):
            checks = [got["checks"][call] for _, got in ranks]
            assert len({c["digest"] for c in checks}) == 1, (job, call, checks)
            for c in checks:
                if c["dtype"] == "int32":
                    assert c["exact"], (job, call, c)
                else:
                    assert c["error"] <= c["bound"], (job, call, c)


MODES = ("inprocess", "plan", "grpc")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_every_run_gets_its_own_exact_sums(mode, shape, tmp_path):
    """First run, second run (other tensors), a run after a worker was killed mid-program, a
    run after a switch restart: every rank of every job exact and bit-identical each time."""
    kwargs, restart = SHAPES[shape]
    dep = Deployment(mode, shape_doc(**kwargs), tmp_path)
    try:
        dep.start()
        run_the_phases(dep, restart)
    finally:
        dep.stop()


def run_the_phases(dep: Deployment, restart: str, **run) -> None:
    """First run, second run, a run with a killed worker, a run after it, a run after the
    switch `restart` restarted: each exact, or failing where a worker was killed. `run`:
    run_program's where and length. A failure also shows what the deployment's processes
    (controller, switches) printed last."""
    try:
        _phases(dep, restart, **run)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dep.processes_tail()}") from None


def _phases(dep: Deployment, restart: str, **run) -> None:
    assert_exact(run_program(dep, seed=1, **run))
    assert_exact(run_program(dep, seed=2, **run))  # not the first run's sums
    killed = run_program(dep, seed=3, die={j: 0 for j in jobs_of(dep.doc)}, timeout=8, **run)
    for ranks in killed.values():
        assert ranks[0][0] == 9, ranks[0]  # the killed rank
        for code, err in ranks[1:]:  # the others time out on their second call
            assert code != 0 and "no result for slot" in err, err
    assert_exact(run_program(dep, seed=4, **run))
    dep.restart_switch(restart)
    assert_exact(run_program(dep, seed=5, **run))


P4_SIZES = {"block_size": 32, "nlanes": 4}  # a full packet fits a 1500-byte frame


def shape_file(shape: str) -> Path:
    """The shape's network on namespaced hosts: bench/topologies/seams_<shape>.yaml."""
    return ROOT / "bench/topologies" / f"seams_{shape.replace('-', '_')}.yaml"


def on_namespaced_hosts(doc: dict, g, rendezvous: str,
                        bmv2_program: tuple[Path, Path] | None = None,
                        ) -> tuple[dict, dict[str, list[str]]]:
    """A shape's desired state moved onto the namespaced hosts of its file, built by `g` (a
    Graph of shape_file's): worker k of the document is the file's host k (its address, MAC
    and switch port the file's; the file must put it on the worker's switch), every
    leaf-spine link of the file in the fabric's links, each switch at its address of the file
    on the INA port, the jobs at the P4 program's sizes, the run rendezvous at `rendezvous`;
    with `bmv2_program` (its device config and P4Info) every switch is BMv2. Returns the
    document and {switch: its interfaces by port}."""
    doc, topo = json.loads(json.dumps(doc)), g.topo
    names = [sw["name"] for sw in doc["switches"]]
    assert sorted(names) == sorted(topo.switches), (topo.source, names)
    for k, (w, h) in enumerate(zip(doc["workers"], topo.hosts, strict=True)):
        sw, (i, _) = topo.neighbours(h)[0]
        assert sw == w["switch"], f"{topo.source}: {h} is on {sw}, worker {w['name']} on " \
                                  f"{w['switch']}"
        w.update(ip=g.host_ip(h), udp_port=50000 + k, mac=g.mac(i, h),
                 switch_port=topo.port_of(sw, i))
    fabric = doc.get("fabric")
    if fabric:
        leaves = {r["leaf"] for r in fabric["racks"]}
        fabric["links"] = []
        for i, ln in enumerate(topo.links):
            if ln.a in topo.segments and ln.b in topo.segments:
                leaf, spine = (ln.a, ln.b) if ln.a in leaves else (ln.b, ln.a)
                fabric["links"].append({
                    "leaf": leaf, "leaf_port": topo.port_of(leaf, i),
                    "leaf_mac": mac_of(g.ifname(i, leaf)), "spine": spine,
                    "spine_port": topo.port_of(spine, i), "spine_mac": mac_of(g.ifname(i, spine))})
    ports = {name: list(g.ports(name).values()) for name in names}
    thrift = free_ports(len(doc["switches"]))
    for n, sw in enumerate(doc["switches"]):
        sw.update(address=topo.segments[sw["name"]].address, udp_port=spec.INA_UDP_PORT,
                  ports=list(g.ports(sw["name"])))
        if bmv2_program is not None:
            sw.update(target="bmv2", thrift_port=thrift[n], device_id=n,
                      device_config=str(bmv2_program[0]), p4info=str(bmv2_program[1]))
    for job in doc["jobs"] + (fabric or {}).get("jobs", []):
        job.update(P4_SIZES)
    doc["rendezvous"] = rendezvous
    return doc, ports


def mac_of(ifname: str) -> str:
    return Path(f"/sys/class/net/{ifname}/address").read_text().strip()


def rank_worker(doc: dict, job: int, rank: int) -> int:
    """The index in doc["workers"] of job `job`'s rank `rank` (a fabric job's ranks are its
    racks' workers in order)."""
    names = next((j["members"] for j in doc["jobs"] if j["id"] == job), None)
    if names is None:
        fab = doc["fabric"]
        racks = next(j["racks"] for j in fab["jobs"] if j["id"] == job)
        names = [w for r in racks for w in next(x["workers"] for x in fab["racks"]
                                                if x["name"] == r)]
    return [w["name"] for w in doc["workers"]].index(names[rank])


NAMESPACE_ROWS = [(t, s) for t in ("l2", "bmv2") for s in SHAPES]  # (target, shape)


@pytest.fixture(scope="module")
def bmv2_program(tmp_path_factory) -> tuple[Path, Path]:
    """The v1model program compiled once for the module's BMv2 rows (p4c takes ~30 s)."""
    from bmv2_tests import bmv2
    if bmv2.unavailable() is not None:
        pytest.skip(bmv2.unavailable())
    return bmv2.compile_p4(tmp_path_factory.mktemp("p4"))


@pytest.mark.parametrize(("target", "shape"), NAMESPACE_ROWS)
def test_switches_on_namespaced_hosts_give_each_run_its_own_exact_sums(target, shape, request,
                                                                       tmp_path):
    """The L2 software switch (`python -m softswitch l2 -i ... --grpc`) and BMv2
    (`simple_switch_grpc --no-p4`, the program pushed by deploy) as a user deploys them: one
    process per switch on the ports of the shape's file (bench/topologies/seams_*.yaml: the
    namespaced hosts' veths and the leaf-spine links); `controller serve` programs the
    switches and answers the run rendezvous on the hosts' management bridge; one process per
    rank in its namespace. The same phases as the UDP modes' matrix: each run exact (after
    the switch restart too)."""
    program = request.getfixturevalue("bmv2_program") if target == "bmv2" else None
    kwargs, restart = SHAPES[shape]
    with managed_network(str(shape_file(shape)), f"{TAG}f") as g:
        doc, ports = on_namespaced_hosts(shape_doc(**kwargs), g, f"{MGMT_IP}:{free_port()}",
                                         program)
        dep = Deployment(target, doc, tmp_path, l2_interfaces=ports)
        # BMv2: a smaller tensor (62 packets a call a rank)
        length = 8_000 if target == "bmv2" else 50_000
        try:
            dep.start()
            run_the_phases(dep, restart, length=length,
                           where=lambda job, r: ["ip", "netns", "exec",
                                                 g.ns(g.topo.hosts[rank_worker(doc, job, r)])])
        finally:
            dep.stop()


def test_every_shape_has_its_network_file():
    """Each shape's file (shape_file) puts worker k of the shape's document on the same switch
    as its host k, and has exactly the shape's switches: the namespaced rows run the shapes
    the UDP rows run."""
    from spina import topology
    for shape, (kwargs, _) in SHAPES.items():
        doc, topo = shape_doc(**kwargs), topology.load(str(shape_file(shape)))
        assert sorted(sw["name"] for sw in doc["switches"]) == sorted(topo.switches), shape
        assert [w["switch"] for w in doc["workers"]] == [
            topo.neighbours(h)[0][0] for h in topo.hosts], shape


# The mininet testbed's two-level networks (testbed/topos.leafspine: every host a worker of
# one fabric job, racks = leaves): (switch nodes, leaves, spines, hosts per leaf)
MININET_ROWS = [("soft", 2, 1, 2), ("soft", 3, 2, 1), ("bmv2", 2, 1, 2)]


@pytest.mark.parametrize(("switch", "leaves", "spines", "per_leaf"), MININET_ROWS)
def test_mininet_testbed_gives_each_run_its_own_exact_sums(switch, leaves, spines, per_leaf,
                                                          tmp_path):
    """The mininet testbed's leaf/spine network (`python -m testbed leafspine --two-level`),
    its switch nodes serving P4Runtime, its hosts also on a management bridge;
    `controller serve` on the testbed's desired state programs every node and answers the
    run rendezvous: the same phases as the other rows, the restart being a node's process
    killed and started again on its ports."""
    from testbed import topos
    from testbed.mn import import_mininet
    try:
        import_mininet()
    except ImportError as e:
        pytest.skip(f"mininet testbed unavailable: {e}")
    if os.geteuid() != 0:
        pytest.skip("the mininet testbed needs root")
    if switch == "bmv2" and (shutil.which("simple_switch_grpc") is None
                             or not (ROOT / "p4src/build/spina_v1model.json").exists()):
        pytest.skip("needs BMv2's simple_switch_grpc on PATH and `make p4` output")
    tb = topos.leafspine(leaves, spines, per_leaf, two_level=True, switch=switch)
    tb.add_job(tb.job_config(job=7))
    try:
        tb.start()  # the testbed deploys once; `serve` owns the runs from here
        with management_bridge([h.pid for h in tb.hosts]):
            doc = dict(tb.desired_state(), rendezvous=f"{MGMT_IP}:{free_port()}")
            nodes = {n.name: n for n in tb.switches}
            dep = Deployment("mininet", doc, tmp_path, nodes=nodes)
            try:
                dep.start()
                run_the_phases(dep, tb.spines[0].name, length=8_000,
                               where=lambda job, r: ["mnexec", "-a", str(tb.hosts[r].pid)])
            finally:
                dep.stop()
    finally:
        tb.stop()


def test_deploy_alone_refuses_a_run_by_name(tmp_path):
    """The README's multi-process path without `serve`: `deploy` writes agent files naming
    the run rendezvous and starts no runs, so a program fails at once saying to start `spina
    serve` (it never takes the switch's stored sums of an earlier program)."""
    doc = shape_doc(flat=2)
    dep = Deployment("inprocess", doc, tmp_path)
    try:
        for name in dep.state.switches:
            dep.start_switch(name)
        program_in_process({n: s.servicer() for n, s in dep.switches.items()}, dep.state)
        with Controller(dep.state, connect=lambda sw: Connection.in_process(
                dep.switches[sw.name].servicer(), sw.device_id)) as ctl:
            ctl.deploy()  # writes the agent files; no rendezvous runs
        assignment = json.loads(dep.agent_file(3, 0).read_text())
        assert assignment["rendezvous"] == {"host": HOST, "port": int(doc["rendezvous"][10:])}
        results = run_program(dep, seed=1, timeout=5)
        for code, err in results[3]:
            assert code != 0 and "cannot connect" in err and "spina serve -c FILE" in err, err
    finally:
        dep.stop()


def test_udp_switches_use_the_fabric_rows_a_deploy_writes():
    """Defect 1 of issue 26: UDP-mode switches behind P4Runtime servers, a fabric deployed over
    gRPC with its links listed (port 0, the UDP mode's one port): every worker gets the whole
    job's sum, not its rack's, and the spine aggregates (before: the UDP data path ignored the
    job_level and leaf_upstream rows the server accepted)."""
    import concurrent.futures

    import numpy as np

    from host_agent.agent import Agent
    from softswitch.p4runtime_server import P4RuntimeServer
    from spina.net import bound_udp_socket
    doc = shape_doc(racks=(2, 2), spines=1)
    doc["fabric"]["links"] = [{"leaf": f"leaf{i}", "leaf_port": 0, "leaf_mac": "02:00:00:00:02:00",
                               "spine": "spine0", "spine_port": 0,
                               "spine_mac": "02:00:00:00:03:00"} for i in range(2)]
    socks = {w["udp_port"]: None for w in doc["workers"]}
    for w in doc["workers"]:
        socks[w["udp_port"]] = bound_udp_socket(HOST, w["udp_port"])
    switches, servers = {}, []
    try:
        for d in doc["switches"]:
            sw = switches[d["name"]] = UdpSwitch(d["address"], d["udp_port"]).start()
            servers.append(P4RuntimeServer(sw.dataplane, d["grpc"],
                                           servicer=sw.servicer()).start())
        state = load_doc(doc)
        with Controller(state) as ctl:
            ctl.deploy(agent_files=False)
            assert {r["installed"] for r in ctl.status()} == {"yes"}
        job = state.fabric.job_config(state.fabric.jobs[7])
        agents = [Agent(job, r, state.fabric.agent_switch(f"w{r}"),
                        sock=socks[w.port], timeout=20) for r, w in enumerate(job.workers)]
        rng = np.random.default_rng(5)
        xs = [rng.integers(-100, 100, 5000).astype(np.int32) for _ in agents]
        with concurrent.futures.ThreadPoolExecutor(len(agents)) as pool:
            got = list(pool.map(lambda a, x: a.allreduce(x), agents, xs))
        want = np.sum(xs, axis=0, dtype=np.int32)
        assert all(np.array_equal(g, want) for g in got)
        assert switches["spine0"].pipeline.job_counters(7)["job_aggregated"] > 0
        for a in agents:
            a.close()
    finally:
        for s in servers:
            s.stop()
        for sw in switches.values():
            sw.stop()


def load_doc(doc: dict):
    """A desired state from a document (as `load` from a file)."""
    from controller.state import parse
    return parse(doc)
