"""Results only from the switch, and only from the run that asked for them (issue 10, defects
1-3): agents drop datagrams from other senders; consecutive programs on one launcher, one daemon
and one controller deployment each get their own sums.

Run just these tests:  .venv/bin/python -m pytest tests/test_run_identity.py

Each program is a set of new processes (tests/run_worker.py, one per rank), as a user's
second training run would be.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from host_agent.agent import Agent, SpinaTimeout
from host_agent.launch import local_job, start_subprocess
from softswitch.p4runtime_server import P4RuntimeServer
from softswitch.udp import UdpSwitch
from spina import wire
from spina.net import free_ports
from spina.procs import stop_process
from tests.waits import file_appears, until

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
WORKER = ("-m", "tests.run_worker")  # run from ROOT (cwd=ROOT)


def run_program(via: str, files, value: float, nranks: int = 2, dtype: str = "float32",
                calls: int = 3, extra=(), timeout: float = 90) -> list[dict]:
    """Start one process per rank (files[r] or the one file), wait for all, return their JSON."""
    procs = []
    for r in range(nranks):
        f = files[r] if isinstance(files, list) else files
        procs.append(subprocess.Popen(
            [sys.executable, *WORKER, "--via", via, str(f), "--rank", str(r), "--value", str(value),
             "--dtype", dtype, "--calls", str(calls), *extra],
            env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs, errs = [], []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append(out)
            errs.append(err)
        assert all(p.returncode == 0 for p in procs), "\n".join(
            f"rank {r} exit {p.returncode}: {e[-1500:]}"
            for r, (p, e) in enumerate(zip(procs, errs)))
        outs = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def assert_all(outs: list[dict], want: float) -> None:
    for o in outs:
        for lo, hi in o["results"]:
            assert lo == hi == want, (o, want)


# --------------------------------------------------------------------------- defect 1
def test_forged_results_from_another_sender_are_dropped_and_counted():
    """A local process forging 'done' results at an agent's port never ends its call."""
    job = local_job(2, nslots=4, nlanes=4, block_size=64)
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        agent = Agent(job, 0, sw.address, timeout=1.5, rto=0.05)
        forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stop = threading.Event()

        def forge():  # setup results with next = END everywhere: "the call is over, all zero"
            end = np.full(job.nlanes, wire.END, wire.NEXT_DTYPE)
            while not stop.is_set():
                for s in range(job.nslots):
                    h = wire.Header(msg_type=wire.MSG_RESULT, flags=wire.FLAG_LAST, job=job.job,
                                    epoch=job.epoch, call=1, slot=s, rank=1, nlanes=job.nlanes,
                                    round=1, length=1000, block_size=job.block_size, bitmap=3)
                    forger.sendto(wire.pack(h, end), (job.workers[0].host, job.workers[0].port))
                time.sleep(0.005)

        t = threading.Thread(target=forge)
        t.start()
        try:
            with pytest.raises(SpinaTimeout) as exc:  # rank 1 never calls
                agent.allreduce(np.ones(1000, np.float32))
            assert exc.value.missing == [1]
            assert agent.last_stats.foreign_packets > 0
            assert agent.last_stats.rounds == 0  # not one forged result was taken
        finally:
            stop.set()
            t.join()
            forger.close()
            agent.close()


# --------------------------------------------------------------------------- defect 2
@pytest.fixture
def launcher(tmp_path):
    """`python -m host_agent.launch` for a 2-rank job; its job file."""
    proc, job_file = start_subprocess(2, str(tmp_path / "job.json"))
    try:
        file_appears(job_file)
        yield job_file
    finally:
        stop_process(proc, 10)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_second_program_on_one_launcher_gets_its_own_sums(launcher, dtype):
    """Ones, then tens, from new processes on the same launcher: 2, then 20."""
    assert_all(run_program("jobfile", launcher, 1, dtype=dtype), 2.0)
    assert_all(run_program("jobfile", launcher, 10, dtype=dtype), 20.0)
    assert_all(run_program("jobfile", launcher, 3, dtype=dtype, calls=1), 6.0)


def test_second_ddp_run_on_one_launcher(launcher, tmp_path):
    """Two torchrun-like DDP runs through the hook on one launcher: each averages its own."""
    for i, v in enumerate((1.0, 5.0)):
        pg = tmp_path / f"pg{i}"
        outs = run_program("ddp", launcher, v, calls=2, extra=("--pg", str(pg)))
        assert_all(outs, v)  # both ranks send v: the average is v


def test_a_replaced_rank_never_mixes_runs(launcher):
    """Rank 1's process is replaced while rank 0's goes on: rank 0's next call fails naming
    rank 1 and the new rank 1 fails naming rank 0 (neither gets a sum of mixed runs); then a
    whole new program is exact."""
    from spina.config import JobFile
    jf = JobFile.load(launcher)
    old = [Agent(jf.job, r, jf.switch, timeout=3, rto=0.05, rendezvous=jf.rendezvous)
           for r in (0, 1)]
    x = np.ones(10_000, np.float32)
    box = []
    t = threading.Thread(target=lambda: _capture(box, old[1].allreduce, x))
    t.start()
    assert old[0].allreduce(x)[0] == 2.0
    t.join()
    assert box[0][0] == 2.0
    old[1].close()
    # its join fails when rank 0 is not there within --timeout (the default, 20 s, only idles)
    new1 = subprocess.Popen([sys.executable, *WORKER, "--via", "jobfile", launcher, "--rank", "1",
                             "--value", "5", "--calls", "1", "--timeout", "3"], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(SpinaTimeout) as exc:
            old[0].allreduce(x)
        assert exc.value.missing == [1]
        _, err = new1.communicate(timeout=60)
    finally:
        if new1.poll() is None:
            new1.kill()
            new1.wait()
        old[0].close()
    assert new1.returncode == 1 and "ranks [0] did not join the run" in err, err[-2000:]
    assert_all(run_program("jobfile", launcher, 7, calls=2), 14.0)


def _capture(box, fn, *a):
    try:
        box.append(fn(*a))
    except Exception as e:  # the test inspects it
        box.append(e)


# --------------------------------------------------------------------------- defect 5
def test_ddp_user_sees_the_spina_error_naming_the_missing_rank(launcher, tmp_path):
    """A DDP step whose peer never joins fails in backward with SpinaTimeout's message naming
    rank 1, not with 'Unable to cast ... to Tensor'."""
    p = subprocess.run([sys.executable, *WORKER, "--via", "ddp", launcher, "--rank", "0",
                        "--value", "1", "--calls", "1", "--world", "1", "--timeout", "2",
                        "--pg", str(tmp_path / "pg")],
                       env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "SpinaTimeout: rank 0: job 1: ranks [1] did not join the run" in p.stderr, \
        p.stderr[-3000:]
    assert "Unable to cast" not in p.stderr


def test_timeout_after_the_switch_lost_the_job_blames_the_switch_not_the_ranks():
    """After the switch forgets the job (a restart without a redeploy), both ranks' calls fail
    saying the switch does not admit the job, and name no rank as missing."""
    job = local_job(2, nslots=2, nlanes=4, block_size=64)
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        agents = [Agent(job, r, sw.address, timeout=1.5, rto=0.05) for r in (0, 1)]
        x = np.ones(1000, np.float32)
        box = [[], []]

        def both():
            ts = [threading.Thread(target=_capture, args=(box[r], agents[r].allreduce, x))
                  for r in (0, 1)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        try:
            both()
            assert box[0][0][0] == box[1][0][0] == 2.0
            sw.remove_job(job.job)  # what a restarted switch knows of the job: nothing
            both()
        finally:
            for a in agents:
                a.close()
    for r in (0, 1):
        err = box[r][1]
        assert isinstance(err, SpinaTimeout) and err.missing == [], err
        assert f"does not admit job {job.job} epoch {job.epoch}" in str(err)


# --------------------------------------------------------------------------- daemon (defect 3)
@pytest.fixture
def daemon(tmp_path, launcher):
    """(job file, socket) of a daemon (timeout 3 s) serving the launcher's job."""
    sock = tmp_path / "agent.sock"
    (tmp_path / "daemon.json").write_text(json.dumps(
        {"socket": str(sock), "log_file": str(tmp_path / "daemon.log"), "timeout": 3, "rto": 0.05}))
    proc = subprocess.Popen([sys.executable, "-m", "host_agent", "daemon", "--config",
                             str(tmp_path / "daemon.json")], env=ENV, cwd=ROOT)
    try:
        file_appears(sock)
        yield launcher, str(sock)
    finally:
        stop_process(proc, 10)


def test_daemon_consecutive_runs_and_a_rank_that_died_between_calls(daemon):
    """Runs through the daemon are exact one after another, also after a run in which rank 1
    left a call early (the ranks were a call apart)."""
    job_file, sock = daemon
    extra = ("--socket", sock)
    assert_all(run_program("daemon", job_file, 1, extra=extra), 2.0)
    # A broken run: rank 0 makes 2 calls, rank 1 only 1 and exits: rank 0's second call fails.
    from host_agent.agent import SpinaError
    from host_agent.daemon.client import DaemonClient
    c0, c1 = DaemonClient(job_file, 0, sock), DaemonClient(job_file, 1, sock)
    x = np.ones(5000, np.float32)
    t = threading.Thread(target=c1.allreduce, args=(x,))
    t.start()
    assert c0.allreduce(x)[0] == 2.0
    t.join()
    c1.close()
    with pytest.raises(SpinaError, match=r"ranks \[1\] never contributed"):
        c0.allreduce(x)
    c0.close()
    assert_all(run_program("daemon", job_file, 10, extra=extra), 20.0)
    assert_all(run_program("daemon", job_file, 4, dtype="int32", extra=extra), 8.0)


# --------------------------------------------------------------------------- controller
@contextlib.contextmanager
def served(tmp_path: Path, nworkers: int = 2):
    """`controller serve` (a subprocess, watch 0.5 s) over a software switch in this process
    with job 3 of `nworkers` ranks: (switch, the agent files by rank, serve's process). Its
    output is read only after it stopped."""
    sw = UdpSwitch("127.0.0.1", 0).start()
    srv = P4RuntimeServer(sw.dataplane, "127.0.0.1:0", servicer=sw.servicer()).start()
    ports, udp = free_ports(1), free_ports(nworkers)
    names = [f"w{i}" for i in range(nworkers)]
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump({
        "switches": [{"name": "s1", "target": "softswitch", "grpc": srv.address,
                      "address": "127.0.0.1", "udp_port": sw.address[1]}],
        "workers": [{"name": n, "ip": "127.0.0.1", "udp_port": udp[i], "switch_port": 0}
                    for i, n in enumerate(names)],
        "jobs": [{"id": 3, "members": names, "nslots": 4, "slot_base": 0,
                  "block_size": 64, "nlanes": 8}],
        "agents_dir": "agents", "rendezvous": f"127.0.0.1:{ports[0]}"}))
    proc = subprocess.Popen([sys.executable, "-m", "controller", "-c", str(cfg), "serve",
                             "--watch", "0.5"], env=ENV, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        files = [tmp_path / "agents" / f"job3-rank{r}.json" for r in range(nworkers)]
        for f in files:
            file_appears(f)
        assert json.loads(files[0].read_text())["rendezvous"] == {"host": "127.0.0.1",
                                                                   "port": ports[0]}
        yield sw, files, proc
    finally:
        stop_process(proc, 10)
        srv.stop()
        sw.stop()


def test_controller_serve_gives_each_run_its_own_epoch(tmp_path):
    """Two programs on one controller deployment (`controller serve`): each gets its own sums,
    and the file's epoch stays while each run gets a new one at the switch."""
    with served(tmp_path) as (sw, files, proc):
        assert_all(run_program("assignment", files, 1, dtype="int32"), 2.0)
        epoch1 = next(iter(sw.pipeline.admission.values())).epoch
        assert_all(run_program("assignment", files, 10, dtype="int32"), 20.0)
        epoch2 = next(iter(sw.pipeline.admission.values())).epoch
        assert (epoch1, epoch2) == (2, 3)  # the file's epoch is 1; each run the next
        assert_all(run_program("assignment", files, 0.5), 1.0)
    out, err = proc.communicate()
    assert "run with epoch 2" in out and "run with epoch 4" in out, (out, err)


def test_daemon_under_serve_second_run_after_serve_rewrote_the_files(tmp_path):
    """Two programs in sequence through one daemon under `controller serve` (4 ranks, one
    process each): serve writes the run's epoch into the agent files after the first run;
    the second program (same files, new processes) still gets its own exact sums, because
    the daemon released each rank's agent (and its port) when its client closed."""
    from host_agent.daemon.client import status
    sock = tmp_path / "agent.sock"

    def no_agents():  # a closed client is detached by the daemon a moment after the close
        return status(str(sock))["agents"] == 0
    daemon = subprocess.Popen([sys.executable, "-m", "host_agent", "daemon", "--socket",
                               str(sock), "--log-file", str(tmp_path / "daemon.log")],
                              env=ENV, cwd=ROOT)
    try:
        file_appears(sock)
        with served(tmp_path, nworkers=4) as (sw, files, proc):
            extra = ("--socket", str(sock))
            assert_all(run_program("daemon", files, 1, nranks=4, extra=extra), 4.0)
            until(no_agents, "the daemon to release every closed client's agent", 10)
            until(lambda: json.loads(files[0].read_text())["job"]["epoch"] != 1,
                  "serve to write the run's epoch into the agent file")
            assert_all(run_program("daemon", files, 10, nranks=4, extra=extra), 40.0)
            until(no_agents, "the daemon to release every closed client's agent", 10)
    finally:
        stop_process(daemon, 10)


def test_rendezvous_server_starts_once_and_stops_in_any_state():
    """A second start() is a no-op (one serving thread); stop() before start() returns at
    once (socketserver's shutdown() would wait forever) and a second stop() is harmless."""
    from spina.rendezvous import RendezvousServer

    def serving():
        return [t for t in threading.enumerate() if t.name == "spina-rendezvous"]
    never = RendezvousServer("127.0.0.1", 0, {1: (2, 1)}, lambda j, e: None)
    never.stop()
    never.stop()
    srv = RendezvousServer("127.0.0.1", 0, {1: (2, 1)}, lambda j, e: None)
    before = len(serving())
    assert srv.start() is srv and srv.start() is srv
    assert len(serving()) == before + 1
    socket.create_connection(srv.address, timeout=2).close()  # it answers
    srv.stop()
    srv.stop()
    assert len(serving()) == before
    with pytest.raises(OSError):
        socket.create_connection(srv.address, timeout=2)


def test_a_join_the_rendezvous_closes_is_joined_again_once_it_listens():
    """The rendezvous restarts (serve restarted) while rank 0 waits for rank 1: rank 0's join
    is forgotten with its connection, so it joins the new server again; the run starts with
    both ranks and each gets the new server's epoch. A rendezvous that closes and never comes
    back fails the join with a message saying so."""
    from spina import rendezvous
    runs = []
    first = rendezvous.RendezvousServer("127.0.0.1", 0, {1: (2, 1)},
                                        lambda j, e: runs.append((j, e))).start()
    address = first.address
    got: dict[int, object] = {}

    def rank(r):
        try:
            got[r] = rendezvous.join(address, 1, r, 2, timeout=10)
        except rendezvous.RendezvousError as e:
            got[r] = e
    t0 = threading.Thread(target=rank, args=(0,))
    t0.start()
    until(lambda: first.jobs[1].waiting, "rank 0's join", 5)
    assert list(first.jobs[1].waiting) == [0]
    first.stop()  # rank 0's connection closes before its run started
    second = rendezvous.RendezvousServer(*address, {1: (2, 7)},
                                         lambda j, e: runs.append((j, e))).start()
    try:
        until(lambda: second.jobs[1].waiting, "rank 0's join again", 5)
        assert list(second.jobs[1].waiting) == [0]  # rank 0 joined again
        rank(1)
        t0.join(10)
        assert got == {0: 8, 1: 8} and runs == [(1, 8)]
    finally:
        second.stop()

    gone = rendezvous.RendezvousServer("127.0.0.1", 0, {1: (2, 1)}, lambda j, e: None).start()
    t0 = threading.Thread(target=rank, args=(0,))
    address = gone.address
    t0.start()
    until(lambda: gone.jobs[1].waiting, "rank 0's join", 5)
    gone.stop()
    t0.join(10)
    assert isinstance(got[0], rendezvous.RendezvousError)
    assert "closed the connection before job 1's run started and no longer takes joins" \
        in str(got[0]), got[0]


def test_a_join_that_times_out_names_only_the_ranks_that_never_joined():
    """Three ranks, rank 2 never joins (no switch needed): ranks 0 and 1 both fail naming
    [2], the rank the rendezvous never heard from, not each other."""
    from spina import rendezvous
    with rendezvous.RendezvousServer("127.0.0.1", 0, {5: (3, 1)}, lambda j, e: None) as srv:
        got: dict[int, rendezvous.RendezvousError] = {}

        def rank(r):
            try:
                rendezvous.join(srv.address, 5, r, 3, timeout=1.5)
            except rendezvous.RendezvousError as e:
                got[r] = e
        ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
    assert sorted(got) == [0, 1]
    for r in (0, 1):
        assert got[r].missing == [2], got[r]
        assert str(got[r]).startswith("job 5: ranks [2] did not join the run within 1.5 s"), got[r]


def test_another_deployments_rendezvous_is_named_not_taken_for_ours():
    """A second deployment on the address of a controller's rendezvous: its rendezvous cannot
    bind and names the first (owner, jobs, pid, file); joins of jobs the first does not serve
    as they are (another id, size or switch) fail naming it; `probe` says whose it is."""
    from spina import owner, rendezvous
    first = rendezvous.RendezvousServer("127.0.0.1", 0, {1: (4, 1)}, lambda j, e: None,
                                        owner="controller", source="/srv/a/spina.yaml",
                                        switches={1: {"127.0.0.1:47000"}}).start()
    host, port = first.address
    whose = f"controller (jobs [1], pid {os.getpid()}, file /srv/a/spina.yaml)"
    try:
        assert rendezvous.probe(first.address) == {
            "owner": "controller", "pid": os.getpid(), "source": "/srv/a/spina.yaml",
            "jobs": {"1": 4}}
        with pytest.raises(owner.AddressInUse) as e:
            rendezvous.RendezvousServer(host, port, {7: (2, 1)}, lambda j, e: None)
        assert str(e.value) == f"{host}:{port} is the rendezvous of another {whose}"
        for job, n, why in ((7, 2, "job 7 is not served here (jobs: [1])"),
                            (1, 2, "job 1 has 4 workers, the agent's job file says 2")):
            with pytest.raises(rendezvous.RendezvousError) as e:
                rendezvous.join(first.address, job, 0, n, timeout=5, switch=("127.0.0.1", 47000))
            assert str(e.value) == f"join: {why}: this is the rendezvous of a {whose}"
        # the same job id and size, another deployment's switch: refused, named
        with pytest.raises(rendezvous.RendezvousError) as e:
            rendezvous.join(first.address, 1, 0, 4, timeout=5, switch=("127.0.0.1", 47001))
        assert str(e.value) == ("join: job 1 aggregates at 127.0.0.1:47000 here, the agent's "
                                f"file names 127.0.0.1:47001: this is the rendezvous of a {whose}")
        assert first.jobs[1].waiting == {}
    finally:
        first.stop()
