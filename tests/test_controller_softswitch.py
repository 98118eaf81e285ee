"""Controller <-> software switch over real gRPC on loopback: the switch's P4Runtime server,
the controller's CLI and API, and host agents configured only by the controller's files.

Run just this file: python -m pytest tests/test_controller_softswitch.py
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
import yaml
from p4.v1 import p4runtime_pb2 as pb

from controller import model, state as state_mod
from controller.controller import Controller
from controller.p4rt import Connection, NotPrimaryError, P4RuntimeError
from host_agent import assignment
from softswitch.dataplane import Dataplane
from softswitch.p4runtime_server import P4RuntimeServer
from softswitch.udp import UdpSwitch
from spina import spec
from spina.net import free_port
from spina.procs import stop_process
from tests.waits import until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)


class SwitchProcess:
    """`python -m softswitch udp --grpc` as a child process on fixed ports (so it can restart
    where it was)."""

    def __init__(self, udp_port: int, grpc_port: int):
        self.udp_port, self.grpc_port = udp_port, grpc_port
        self.proc = None

    def start(self) -> "SwitchProcess":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "softswitch", "udp", "--port", str(self.udp_port),
             "--grpc", f"127.0.0.1:{self.grpc_port}"],
            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2):  # "listening ..." then "p4runtime ..."
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.proc = None


def cli(cfg, *args, check=True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "controller", "-c", str(cfg), *args], cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def desired(grpc_addr: str, udp_port: int, nworkers: int = 4) -> dict:
    return {"switches": [{"name": "s1", "target": "softswitch", "grpc": grpc_addr,
                          "address": "127.0.0.1", "udp_port": udp_port}],
            "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "udp_port": free_port(),
                         "switch_port": 0} for i in range(nworkers)],
            "jobs": [], "agents_dir": "agents", "rendezvous": f"127.0.0.1:{free_port()}"}


def allreduce_all(cfg, paths: list, seed: int) -> None:
    """Every agent file's worker all-reduces its own tensor, in a run the controller of `cfg`
    starts (its run rendezvous, as `serve`); each job's sum must be exact."""
    agents = [assignment.connect(p, timeout=10) for p in paths]
    ctl = Controller(state_mod.load(cfg))
    runs = ctl.runs().start()
    try:
        rng = np.random.default_rng(seed)
        xs = []
        for _ in agents:
            x = rng.integers(-1000, 1000, 20000).astype(np.int32)
            x[rng.random(20000) < 0.5] = 0  # sparse
            xs.append(x)
        with concurrent.futures.ThreadPoolExecutor(len(agents)) as ex:
            res = list(ex.map(lambda i: agents[i].allreduce(xs[i]), range(len(agents))))
        for i, a in enumerate(agents):
            want = sum(xs[j] for j, b in enumerate(agents) if b.job.job == a.job.job)
            np.testing.assert_array_equal(res[i], want)
    finally:
        for a in agents:
            a.close()
        runs.stop()
        ctl.close()


@pytest.fixture
def switch_process():
    """The software switch as a child process; stopped afterwards."""
    sw = SwitchProcess(free_port(), free_port())
    yield sw
    sw.stop()


@pytest.fixture
def inproc():
    """An in-process UDP software switch with its P4Runtime server on a free port."""
    sw = UdpSwitch("127.0.0.1", 0).start()
    srv = P4RuntimeServer(sw.dataplane, "127.0.0.1:0", servicer=sw.servicer()).start()
    yield sw, srv
    srv.stop()
    sw.stop()


def test_deploy_two_jobs_remove_restart_redeploy(switch_process, tmp_path):
    """CLI deploy, two jobs aggregate, one removed, switch restarted, deploy restores the other."""
    sw = switch_process.start()
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump(desired(f"127.0.0.1:{sw.grpc_port}", sw.udp_port)))
    assert "pipeline pushed" in cli(cfg, "deploy").stdout
    assert "pipeline current, 0 inserted, 0 modified, 0 deleted" in cli(cfg, "deploy").stdout
    common = ["--nslots", "4", "--block-size", "64", "--nlanes", "8"]
    assert "slots 0..3" in cli(cfg, "job", "add", "--id", "1", "--members", "w0,w1", *common).stdout
    assert "slots 4..7" in cli(cfg, "job", "add", "--id", "2", "--members", "w2,w3", *common).stdout
    agents = tmp_path / "agents"
    allreduce_all(cfg, [agents / f"job{j}-rank{r}.json" for j in (1, 2) for r in (0, 1)], seed=1)
    jobs_table, ports_table = cli(cfg, "status").stdout.split("\n\n")
    assert jobs_table.splitlines()[0].split()[:2] == ["job", "switch"]
    assert len(jobs_table.splitlines()) == 4  # header, rule, two jobs
    assert [int(r.split()[-1]) for r in jobs_table.splitlines()[2:]] == [0, 0]  # no drops
    assert ports_table.split()[:4] == ["switch", "port", "port_malformed", "port_unadmitted"]

    out = cli(cfg, "job", "remove", "--id", "1").stdout
    assert "slots cleared: job 1 0..3" in out
    assert [j["id"] for j in yaml.safe_load(cfg.read_text())["jobs"]] == [2]
    assert sorted(p.name for p in agents.iterdir()) == ["job2-rank0.json", "job2-rank1.json",
                                                       "job2.json"]

    sw.stop()
    sw.start()  # same ports, empty tables
    out = cli(cfg, "deploy").stdout
    # endpoint, group, 2 admission, 2 rewrite
    assert "pipeline pushed" in out and "6 inserted" in out
    allreduce_all(cfg, [agents / f"job2-rank{r}.json" for r in (0, 1)], seed=2)
    rows = cli(cfg, "status").stdout.split("\n\n")[0].splitlines()
    assert len(rows) == 3 and rows[2].split()[0] == "2"


def test_second_controller_takes_over(inproc, tmp_path):
    """A controller with a higher election id becomes primary; the first refuses to write and
    the switch itself answers PERMISSION_DENIED to its writes."""
    _, srv = inproc
    p = tmp_path / "spina.yaml"
    d = desired(srv.address, 47000)
    p.write_text(yaml.safe_dump(d))
    st = state_mod.load(p)
    with Controller(st, election=1) as first:
        first.deploy()
        with Controller(st, election=2) as second:
            second.deploy()
            conn1 = first.session("s1").conn

            def demoted():  # the arbitration update has reached the first controller
                conn1.refresh_arbitration()
                return not conn1.is_primary
            until(demoted, "the first controller to learn it was demoted", 10)
            with pytest.raises(NotPrimaryError, match="refusing to write"):
                first.set_state(st.with_job(model.Job(id=3, members=("w0",), nslots=1)))
            conn = first.session("s1").conn
            req = pb.WriteRequest(device_id=0, election_id=pb.Uint128(low=1))
            req.updates.add(type=pb.Update.INSERT).entity.table_entry.CopyFrom(
                conn.index.table_entry("l2", {"dst_mac": "02:00:00:00:00:01"}, "bridge",
                                       {"port": 1}))
            with pytest.raises(grpc.RpcError) as e:
                conn.stub.Write(req)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            first.close()  # frees election id 1 for the CLI below
            out = cli(p, "deploy", check=False)  # election id 1 < 2: refused, exit 3
            assert out.returncode == 3 and "refusing to write" in out.stderr


def test_pipeline_lacking_names_is_rejected(inproc):
    """SetForwardingPipelineConfig names every table, register and counter the P4Info lacks."""
    _, srv = inproc
    info = spec.p4info()
    keep = [t for t in info.tables if t.preamble.name != "admission"]
    del info.tables[:]
    info.tables.extend(keep)
    regs = [r for r in info.registers if r.preamble.name != "slot_round"]
    del info.registers[:]
    info.registers.extend(regs)
    with Connection(srv.address) as c:
        with pytest.raises(P4RuntimeError) as e:
            c.set_pipeline(info, b"", 1)
    assert "INVALID_ARGUMENT" in str(e.value)
    assert "table admission" in str(e.value) and "register slot_round" in str(e.value)


def test_removal_clears_only_that_jobs_slots(inproc, tmp_path):
    """Removing a job zeroes its slot registers over P4Runtime and leaves its neighbour's."""
    sw, srv = inproc
    d = desired(srv.address, sw.address[1])
    d["jobs"] = [{"id": 1, "members": ["w0", "w1"], "nslots": 2, "slot_base": 0},
                 {"id": 2, "members": ["w2", "w3"], "nslots": 2, "slot_base": 2}]
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(d))
    st = state_mod.load(p)
    with Controller(st) as c:
        c.deploy()
        regs = sw.pipeline.registers
        regs["slot_round"][:8] = 5
        regs["slot_values"][:8, :4] = 9
        c.set_state(st.without_job(1))
        assert list(regs["slot_round"][:8]) == [0, 0, 0, 0, 5, 5, 5, 5]
        assert (regs["slot_values"][:4, :4] == 0).all()
        assert (regs["slot_values"][4:8, :4] == 9).all()
        assert c.session("s1").registers.read("slot_round", 4) == 5
    assert [a.job for a in sw.pipeline.admission.values()] == [2, 2]


def test_l2_dataplane_programmed_by_controller(tmp_path):
    """The L2-mode Dataplane gets admission, groups, rewrites, l2 and congestion entries from
    the controller."""
    dp = Dataplane()
    with P4RuntimeServer(dp, "127.0.0.1:0") as srv:
        d = desired(srv.address, 47000, nworkers=2)
        d["switches"][0].update(address="10.0.0.100", ports=[1, 2])
        for i, w in enumerate(d["workers"]):
            w.update(ip=f"10.0.0.{i + 1}", switch_port=i + 1, mac=f"02:00:00:00:01:0{i}")
        d["jobs"] = [{"id": 7, "members": ["w0", "w1"], "nslots": 4, "slot_base": 0,
                      "block_size": 32, "nlanes": 4, "drop_qdepth": 64, "bounded_loss": 0.1}]
        p = tmp_path / "spina.yaml"
        p.write_text(yaml.safe_dump(d))
        with Controller(state_mod.load(p)) as c:
            c.deploy()
    assert dp.mcast_groups == {8: [(1, 225), (2, 226)]}
    assert dp.worker_rewrite[226][2] == d["workers"][1]["udp_port"]
    assert dp.l2 == {bytes.fromhex("020000000100"): 1, bytes.fromhex("020000000101"): 2}
    assert dp.congestion.table == {7: (64, spec.loss_bound(0.1))}
    assert {k[0] for k in dp.pipeline.admission} == {1, 2}


def test_softswitch_grpc_binds_loopback_only():
    """`python -m softswitch udp --grpc 0.0.0.0:9559` is refused: P4Runtime has no auth here."""
    out = subprocess.run([sys.executable, "-m", "softswitch", "udp", "--port", "0", "--grpc",
                          "0.0.0.0:9559"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "loopback" in out.stderr


def admitted_jobs(grpc_addr: str) -> set[int]:
    """Jobs the switch's admission table holds, read as a backup client (election id 0)."""
    try:
        with Connection(grpc_addr, election=0, timeout=2) as c:
            cur = c.get_pipeline()
            if cur is None:
                return set()
            c.use_pipeline(cur.p4info)
            return {m.exact.value[0] for e in c.read_table("admission") for m in e.match
                    if m.field_id == 4}
    except Exception:
        return set()


def test_watch_restores_a_restarted_switch(switch_process, tmp_path):
    """`deploy --watch` redeploys by itself after a switch restart and picks up `job add`."""
    sw = switch_process.start()
    addr = f"127.0.0.1:{sw.grpc_port}"
    d = desired(addr, sw.udp_port)
    d["jobs"] = [{"id": 1, "members": ["w0", "w1"], "nslots": 2, "slot_base": 0}]
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump(d))
    watch = subprocess.Popen([sys.executable, "-m", "controller", "-c", str(cfg), "deploy",
                              "--watch", "0.2"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        until(lambda: admitted_jobs(addr) == {1}, "the watch to deploy job 1")
        sw.stop()
        sw.start()
        until(lambda: admitted_jobs(addr) == {1}, "the watch to restore job 1 after a restart")
        d["jobs"].append({"id": 2, "members": ["w2", "w3"], "nslots": 2, "slot_base": 2})
        cfg.write_text(yaml.safe_dump(d))
        until(lambda: admitted_jobs(addr) == {1, 2}, "the watch to add job 2")
    finally:
        watch.terminate()
        watch.wait(10)


def test_refused_connection_fails_at_once_naming_the_address():
    """A Connection to a port nobody listens on raises P4RuntimeError naming the address and
    the refusal (not gRPC's "within 30 s" after retrying); wait_listening, given 0.2 s,
    names the address and the refusal too."""
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(P4RuntimeError) as e:
        Connection(addr, election=None, timeout=30)
    assert str(e.value) == f"no P4Runtime server at {addr}: Connection refused (is the " \
                           "switch running?)"
    from controller.p4rt import wait_listening
    with pytest.raises(P4RuntimeError) as e:
        wait_listening(addr, 0.2)
    assert str(e.value) == (f"no P4Runtime server listening at {addr} within 0.2 s "
                            "(Connection refused)")


def test_wait_listening_then_connect_to_a_server_still_starting():
    """A server whose port opens 0.5 s after the caller starts waiting: wait_listening returns
    once it listens and the Connection that follows reads its (empty) pipeline."""
    import threading

    from controller.p4rt import wait_listening
    addr = f"127.0.0.1:{free_port()}"
    servers = []
    starter = threading.Timer(0.5, lambda: servers.append(
        P4RuntimeServer(Dataplane(), addr).start()))
    starter.start()
    try:
        wait_listening(addr, 30)
        with Connection(addr, election=None, timeout=10) as c:
            assert c.get_pipeline() is None
    finally:
        starter.join()
        for s in servers:
            s.stop()
