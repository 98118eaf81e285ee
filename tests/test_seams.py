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
the controller wrote, as a user's program does. The L2 mode and BMv2 meet the same phases with
the switch on the veths of namespaced hosts (`python -m softswitch l2 --grpc`,
`simple_switch_grpc --no-p4`; `controller serve` answering the rendezvous on a management
bridge; BMv2 skips, saying why, where p4c and BMv2 are not installed); the fabric roles in L2
mode and on BMv2 meet their rows packet by packet in tests/test_scale_out.py and bmv2_tests/.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from bench.scale_out import spine_hosts
from controller.controller import Controller, program_in_process
from controller.p4rt import Connection, P4RuntimeError, wait_listening
from controller.state import load
from netns import MGMT_IP, SWITCH_IP, hosts, managed_hosts  # noqa: F401  (fixtures)
from softswitch.udp import UdpSwitch
from spina import spec
from spina.net import free_ports
from spina.procs import stop_process

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
WORKER = str(ROOT / "tests" / "run_worker.py")
HOST = "127.0.0.1"
CALLS = 2  # an int32 call, then a float32 call (run_worker.tensor)


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


def jobs_of(doc: dict) -> dict[int, int]:
    """{job id: ranks} of a shape's jobs."""
    out = {j["id"]: len(j["members"]) for j in doc["jobs"]}
    for j in doc.get("fabric", {}).get("jobs", []):
        out[j["id"]] = sum(len(r["workers"]) for r in doc["fabric"]["racks"]
                           if r["name"] in j["racks"])
    return out


# ---------------------------------------------------------------- ways of running the switches
class Processes:
    """Child processes, each printing lines; `wait_line` waits for one that starts with a
    prefix. Every process started here is stopped by `stop`."""

    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}
        self.lines: dict[str, list[str]] = {}

    def start(self, name: str, *args: str, program: str = sys.executable) -> None:
        p = subprocess.Popen([program, *args], cwd=ROOT, env=ENV, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs[name], self.lines[name] = p, []
        threading.Thread(target=self._read, args=(name, p), daemon=True).start()

    def _read(self, name, p):
        for line in p.stdout:
            self.lines[name].append(line.rstrip())

    def wait_line(self, name: str, prefix: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [x for x in self.lines[name] if x.startswith(prefix)]
            if got:
                return got[-1]
            p = self.procs[name]
            assert p.poll() is None, f"{name} exited {p.returncode}: {self.lines[name]}"
            time.sleep(0.05)
        raise AssertionError(f"{name}: no line {prefix!r} in {timeout} s: {self.lines[name]}")

    def kill(self, name: str) -> None:
        p = self.procs.pop(name)
        p.kill()
        p.wait()

    def stop(self) -> None:
        for p in self.procs.values():
            stop_process(p, 10)
        self.procs.clear()


class Deployment:
    """The shape's switches and the controller that owns its runs, in one of the modes."""

    def __init__(self, mode: str, doc: dict, tmp: Path, l2_interfaces: list[str] = ()):
        self.mode, self.doc = mode, doc
        self.l2_interfaces = l2_interfaces  # mode "l2": the switch's port p is [p - 1]
        self.cfg = tmp / "spina.yaml"
        self.cfg.write_text(yaml.safe_dump(doc))
        self.state = load(self.cfg)
        self.procs = Processes()
        self.switches: dict[str, UdpSwitch] = {}
        self.ctl = self.runs = None

    def _spines_first(self) -> list[str]:
        return sorted(self.state.switches, key=lambda n: not n.startswith("spine"))

    def start(self) -> None:
        for name in self._spines_first():
            self.start_switch(name)
        if self.mode == "inprocess":
            self.ctl = Controller(self.state, connect=lambda sw: Connection.in_process(
                self.switches[sw.name].servicer(), sw.device_id))
            self.ctl.deploy()
            self.runs = self.ctl.runs().start()
        else:
            self.procs.start("controller", "-m", "controller", "-c", str(self.cfg), "serve",
                             "--watch", "0.5")
            self.procs.wait_line("controller", "controller: run rendezvous on")
            for job, n in jobs_of(self.doc).items():
                for r in range(n):
                    self.wait_file(self.agent_file(job, r))

    def start_switch(self, name: str) -> None:
        sw = self.state.switches[name]
        if self.mode == "inprocess":
            self.switches[name] = UdpSwitch(sw.address, sw.udp_port).start()
            return
        if self.mode == "plan":
            self.procs.start(name, "-m", "softswitch", "udp", "--plan", str(self.cfg),
                             "--switch", name)
            self.procs.wait_line(name, "p4runtime ")
        elif self.mode == "l2":
            self.procs.start(name, "-m", "softswitch", "l2", *self._ports(), "--grpc", sw.grpc)
            self.procs.wait_line(name, "p4runtime ")
        elif self.mode == "bmv2":  # started empty, as BMv2 starts: deploy pushes the program
            self.procs.start(name, "--device-id", str(sw.device_id), "--no-p4", "--thrift-port",
                             str(sw.thrift_port), *self._ports(), "--", "--grpc-server-addr",
                             sw.grpc, "--priority-queues", "8", program="simple_switch_grpc")
            try:
                wait_listening(sw.grpc)  # its gRPC server listening
            except P4RuntimeError as e:
                raise AssertionError(f"{e}: {self.procs.lines[name]}") from None
        else:
            self.procs.start(name, "-m", "softswitch", "udp", "--host", sw.address, "--port",
                             str(sw.udp_port), "--grpc", sw.grpc)
            self.procs.wait_line(name, "p4runtime ")

    def _ports(self) -> list[str]:
        """-i arguments: the switch's port p on l2_interfaces[p - 1]."""
        return [a for p, ifname in enumerate(self.l2_interfaces, 1)
                for a in ("-i", f"{p}@{ifname}")]

    def restart_switch(self, name: str) -> None:
        """The switch dies (its registers and tables lost) and starts again where it was. In
        process the test reconciles it as `serve` would; the processes' `serve` does."""
        if self.mode == "inprocess":
            self.switches.pop(name).stop()
            self.start_switch(name)
            with self.ctl.lock:
                self.ctl.close()  # new sessions: the old switch's servicer is gone
                self.ctl.deploy([name], agent_files=False)
        else:
            self.procs.kill(name)
            self.start_switch(name)

    def agent_file(self, job: int, rank: int) -> Path:
        return self.cfg.parent / "agents" / f"job{job}-rank{rank}.json"

    @staticmethod
    def wait_file(path: Path, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.runs is not None:
            self.runs.stop()
        if self.ctl is not None:
            self.ctl.close()
        self.procs.stop()
        for sw in self.switches.values():
            sw.stop()


def run_program(dep: Deployment, seed: int, die: dict[int, int] | None = None,
                timeout: float = 30, where=None,
                length: int = 50_000) -> dict[int, list[tuple[int, dict | str]]]:
    """Every rank of every job as its own process at once; {job: [(exit code, its JSON or
    its last output lines)] by rank}. die: {job: rank} killed after its first call.
    where(job, rank): the command that runs a rank's process elsewhere (a namespace);
    length: elements per tensor."""
    procs = {}
    for job, n in jobs_of(dep.doc).items():
        for r in range(n):
            extra = ["--die-after", "1"] if (die or {}).get(job) == r else []
            procs[(job, r)] = subprocess.Popen(
                [*(where(job, r) if where else ()), sys.executable, WORKER,
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
    run_program's where and length."""
    assert_exact(run_program(dep, seed=1, **run))
    assert_exact(run_program(dep, seed=2, **run))  # not the first run's sums
    killed = run_program(dep, seed=3, die={j: 0 for j in jobs_of(dep.doc)}, timeout=8, **run)
    for ranks in killed.values():
        assert ranks[0][0] == 9, ranks[0]  # the killed rank
        assert all(code != 0 for code, _ in ranks[1:]), ranks  # the others time out
    assert_exact(run_program(dep, seed=4, **run))
    dep.restart_switch(restart)
    assert_exact(run_program(dep, seed=5, **run))


NAMESPACE_TARGETS = ("l2", "bmv2")


@pytest.mark.parametrize("hosts", [3], indirect=True)
@pytest.mark.parametrize("target", NAMESPACE_TARGETS)
def test_switches_on_namespaced_hosts_give_each_run_its_own_exact_sums(target, managed_hosts,
                                                                     tmp_path):
    """The L2 software switch (`python -m softswitch l2 -i ... --grpc`) and BMv2
    (`simple_switch_grpc --no-p4`, the program pushed by deploy) as a user deploys them, on the
    veths of three namespaced hosts; `controller serve` programs the switch and answers the
    run rendezvous on the hosts' management bridge; one process per rank in its namespace.
    The same phases as the UDP modes' matrix: each run exact (after the switch restart too)."""
    if target == "bmv2":
        from bmv2_tests import bmv2
        if bmv2.unavailable() is not None:
            pytest.skip(bmv2.unavailable())
        device_config, p4info = bmv2.compile_p4(tmp_path)
    n = len(managed_hosts)
    grpc, rdv, thrift = free_ports(3)
    switch = {"name": "s0", "target": "softswitch", "grpc": f"{HOST}:{grpc}",
              "address": SWITCH_IP, "udp_port": spec.INA_UDP_PORT,
              "ports": list(range(1, n + 1))}
    if target == "bmv2":
        switch.update(target="bmv2", thrift_port=thrift, p4info=str(p4info),
                      device_config=str(device_config))
    doc = {"switches": [switch],
           "workers": [{"name": f"f{r}", "ip": f"10.0.0.{r + 1}", "udp_port": 50000 + r,
                        "switch_port": r + 1, "mac": f"02:00:00:00:01:{r:02x}"}
                       for r in range(n)],
           "jobs": [{"id": 3, "members": [f"f{r}" for r in range(n)], "nslots": 8,
                     "slot_base": 0, "block_size": 32, "nlanes": 4}],  # the P4 sizes
           "agents_dir": "agents", "rendezvous": f"{MGMT_IP}:{rdv}"}
    dep = Deployment(target, doc, tmp_path, l2_interfaces=[sw_if for _, sw_if in managed_hosts])
    # BMv2 serves a few hundred packets a second: a smaller tensor (62 packets a call a rank)
    length = 8_000 if target == "bmv2" else 50_000
    try:
        dep.start()
        run_the_phases(dep, "s0", length=length,
                       where=lambda job, r: ["ip", "netns", "exec", managed_hosts[r][0]])
    finally:
        dep.stop()


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
