"""The host agent daemon (host_agent/daemon/): local clients, a client dying mid-call, SIGTERM.

Run just these tests:  .venv/bin/python -m pytest tests/test_daemon.py

Each test runs a software switch on a thread of the test process and the daemon as a
subprocess (`python -m host_agent daemon`), and stops both.
"""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from host_agent.daemon import DaemonClient, DaemonConfig, status
from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina.config import ConfigError, JobFile
from tests.waits import until

ROOT = Path(__file__).resolve().parents[1]


def _env():
    return dict(os.environ,
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def setup(tmp_path):
    """(job file, socket path, daemon process, log path) with a switch serving a 2-rank job."""
    job = local_job(2)
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        job_file = tmp_path / "job.json"
        JobFile(job, sw.address).write(job_file)
        sock, logf = tmp_path / "agent.sock", tmp_path / "daemon.log"
        (tmp_path / "daemon.json").write_text(json.dumps(
            {"socket": str(sock), "log_file": str(logf), "timeout": 20, "rto": 0.05}))
        proc = subprocess.Popen([sys.executable, "-m", "host_agent", "daemon", "--config",
                                 str(tmp_path / "daemon.json")], env=_env(), cwd=ROOT)
        try:
            until(sock.exists, "the daemon's socket", 20)
            yield str(job_file), str(sock), proc, logf
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _stop(proc, sock, logf):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert not os.path.exists(sock), "the daemon removes its socket on SIGTERM"
    assert "daemon stopped" in Path(logf).read_text()


def test_two_local_processes_allreduce_and_sigterm(setup):
    """Two clients (ranks 0 and 1) get the sum through the daemon; SIGTERM exits cleanly."""
    job_file, sock, proc, logf = setup
    with DaemonClient(job_file, 0, sock) as c0, DaemonClient(job_file, 1, sock) as c1, \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        xs = [np.arange(3000, dtype=np.float32) * (r + 1) for r in range(2)]
        for _ in range(2):  # the second call reuses the shared-memory segments
            outs = [f.result(timeout=30) for f in
                    [pool.submit(c.allreduce, x) for c, x in zip((c0, c1), xs)]]
            np.testing.assert_allclose(outs[0], xs[0] * 3, rtol=1e-6)
            np.testing.assert_array_equal(outs[0], outs[1])
        ints = [f.result(timeout=30)
                for f in [pool.submit(c.allreduce, np.full(10, r + 5, np.int32))
                          for r, c in enumerate((c0, c1))]]
        np.testing.assert_array_equal(ints[0], np.full(10, 11, np.int32))
        assert c0.last_stats.length == 10 and c0.status()["calls_done"] == 6
    _stop(proc, sock, logf)


CLIENT = """
import sys, numpy as np
from host_agent.daemon import DaemonClient
c = DaemonClient(sys.argv[1], 0, sys.argv[2])
c.allreduce(np.full(5000, 1.0, np.float32))  # blocks: rank 1 has not called yet
"""


def test_survives_a_client_dying_mid_call(setup):
    """A rank-0 client killed mid-call: the call completes, and the next rank-0 client is served."""
    job_file, sock, proc, logf = setup
    victim = subprocess.Popen([sys.executable, "-c", CLIENT, job_file, sock], env=_env(), cwd=ROOT)
    try:
        until(lambda: status(sock)["calls_in_progress"] == 1, "the victim's call", 20)
        victim.kill()
        victim.wait()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    with DaemonClient(job_file, 1, sock) as c1:
        # Rank 1 completes the orphaned call: the dead client's 1.0 + this 2.0.
        np.testing.assert_array_equal(c1.allreduce(np.full(5000, 2.0, np.float32)),
                                      np.full(5000, 3.0, np.float32))
        until(lambda: status(sock)["clients_lost"] == 1, "the daemon to notice the loss", 20)
        with DaemonClient(job_file, 0, sock) as c0, \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(c.allreduce, np.full(700, v, np.float32))
                    for c, v in ((c0, 4.0), (c1, 0.5))]
            for f in futs:
                np.testing.assert_array_equal(f.result(timeout=30), np.full(700, 4.5, np.float32))
    assert "went away during a call" in Path(logf).read_text()
    _stop(proc, sock, logf)


def test_torch_hook_through_the_daemon(setup):
    """The DDP hook works with agent_from_env(daemon_socket=...) in place of an in-process agent."""
    import torch

    from host_agent.assignment import agent_from_env
    from host_agent.hooks import SpinaHookState, spina_allreduce_hook

    class Bucket:
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    job_file, sock, proc, logf = setup
    clients = [agent_from_env(job_file, rank=r, daemon_socket=sock) for r in range(2)]
    try:
        states = [SpinaHookState(c) for c in clients]
        xs = [torch.full((1000,), float(r + 1), dtype=torch.bfloat16) for r in range(2)]
        outs = [f.wait() for f in [spina_allreduce_hook(s, Bucket(x)) for s, x in zip(states, xs)]]
        assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
        assert torch.equal(outs[0], torch.full((1000,), 1.5, dtype=torch.bfloat16))
        assert states[0].calls == 1 and states[0].payload_bytes_sent > 0
    finally:
        for c in clients:
            c.close()
    _stop(proc, sock, logf)


def test_relaunched_job_gets_a_new_agent(setup, tmp_path):
    """Same job id and epoch relaunched on another switch and ports: the daemon follows the
    file (a new agent per rank, the old one closed, also while its client is attached)."""
    job_file, sock, proc, logf = setup
    old = [DaemonClient(job_file, r, sock) for r in (0, 1)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        [f.result(timeout=30)
         for f in [pool.submit(c.allreduce, np.ones(10, np.float32)) for c in old]]
    job2 = local_job(2)
    with UdpSwitch(port=0) as sw2:
        sw2.add_job(job2)
        JobFile(job2, sw2.address).write(job_file)
        with DaemonClient(job_file, 0, sock) as c0, DaemonClient(job_file, 1, sock) as c1, \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            outs = [f.result(timeout=30) for f in
                    [pool.submit(c.allreduce, np.full(10, 2.0, np.float32)) for c in (c0, c1)]]
            assert status(sock)["agents"] == 2
        np.testing.assert_array_equal(outs[0], np.full(10, 4.0, np.float32))
        assert sw2.packets_in > 0
    for c in old:
        c.close()
    assert "job file changed" in Path(logf).read_text()
    assert status(sock)["agents"] == 2  # no rendezvous: the ranks' agents stay for the next
    _stop(proc, sock, logf)


def test_config_errors_name_the_field(tmp_path):
    """An unknown or invalid field in the daemon's config file is named in the error."""
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"sockett": "/tmp/x"}))
    with pytest.raises(ConfigError, match="unknown field 'sockett'"):
        DaemonConfig.load(str(p))
    p.write_text(json.dumps({"timeout": -1}))
    with pytest.raises(ConfigError, match="field 'timeout'"):
        DaemonConfig.load(str(p))


def test_help():
    """`python -m host_agent daemon --help` documents the command."""
    out = subprocess.run([sys.executable, "-m", "host_agent", "daemon", "--help"], env=_env(),
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--config" in out.stdout and "SIGTERM" in out.stdout


def test_second_daemon_on_a_live_socket_refuses(setup):
    """A second daemon on the socket a live daemon serves exits 2 naming it; the first keeps
    serving."""
    _, sock, proc, _ = setup
    out = subprocess.run([sys.executable, "-m", "host_agent", "daemon", "--socket", sock],
                         env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().endswith(f"socket {sock}: another daemon is serving it (stop it "
                                       "first, or give this one another --socket)"), out.stderr
    assert proc.poll() is None and status(sock)["ok"]


def test_agent_status_prints_counters_for_people_and_json_for_scripts(setup):
    """`spina agent status` names each counter of the running daemon on one line; `--json`
    prints the daemon's reply as it is."""
    _, sock, _, _ = setup
    run = [sys.executable, "-m", "host_agent", "status", "--socket", sock]
    human = subprocess.run(run, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    reply = status(sock)
    assert human.returncode == 0
    assert human.stdout == (f"daemon at {sock}: ok; {reply['agents']} job agents attached; "
                            f"calls: 0 in progress, {reply['calls_done']} done; "
                            f"{reply['clients_lost']} clients lost; "
                            f"{reply['foreign_packets']} foreign datagrams dropped\n")
    js = subprocess.run(run + ["--json"], env=_env(), cwd=ROOT, capture_output=True, text=True,
                        timeout=60)
    assert js.returncode == 0 and json.loads(js.stdout) == status(sock)


def test_a_training_process_imports_the_client_without_the_server():
    """`from host_agent.daemon import DaemonClient` (the torch hook's import) loads the
    client and the protocol only: the server (its agents, sockets, DLCP) stays out."""
    code = ("import sys; from host_agent.daemon import DaemonClient, status; "
            "print(sorted(m for m in sys.modules if m.startswith('host_agent.daemon')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "['host_agent.daemon', 'host_agent.daemon.client', " \
                  "'host_agent.daemon.protocol']"
