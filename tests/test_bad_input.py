"""Every surface answers bad input with one line naming the option, field or file (issue 10).

Run just these tests:  PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_bad_input.py

One table per surface. Command-line and file cases run the real CLI as a subprocess and expect
exit status 2, exactly one non-empty line on stderr that names the culprit, and no traceback.
Protocol cases send raw frames to a Daemon on a thread of this process; job-file cases call
the loaders. Also the regression test of defect 4 (a job file naming 0.0.0.0 made the daemon
bind the wildcard).
"""
import argparse
import contextlib
import copy
import importlib
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from host_agent.agent import Agent
from host_agent.daemon.protocol import MAX_MESSAGE
from host_agent.daemon.server import Daemon, DaemonConfig
from spina import cli
from spina.config import Assignment, ConfigError, JobConfig, JobFile, WorkerAddr
from spina.net import free_ports
from spina_cli.main import COMMANDS, PARSERS

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

# Files a case may refer to by name; written into the case's temporary directory.
GOOD_WORKERS = [{"host": "127.0.0.1", "port": 50000}, {"host": "127.0.0.1", "port": 50001}]
GOOD_JOB = {"job": 1, "nslots": 4, "block_size": 32, "nlanes": 4, "workers": GOOD_WORKERS}
FILES = {
    "jobs_syntax.json": '[{"job": 1,',
    "jobs_syntax.yaml": "jobs: [{job: 1, workers: [",
    "jobs_null.json": json.dumps({"jobs": [None]}),
    "jobs_null_worker.json": json.dumps([dict(GOOD_JOB, workers=[None])]),
    "jobs_dup_worker.json": json.dumps([dict(GOOD_JOB, workers=[GOOD_WORKERS[0]] * 2)]),
    "jobs_dup_job.json": json.dumps([GOOD_JOB, dict(GOOD_JOB, slot_base=4)]),
    "jobs_float_nslots.json": json.dumps([dict(GOOD_JOB, nslots=2.5)]),
    "jobs_str_nslots.yaml": yaml.safe_dump([dict(GOOD_JOB, nslots="four")]),
    "jobs_big_port.json": json.dumps([dict(GOOD_JOB, workers=[{"host": "127.0.0.1",
                                                               "port": 70000}])]),
    "jobs_name_host.json": json.dumps([dict(GOOD_JOB, workers=[{"host": "node7",
                                                                "port": 50000}])]),
    "jobs_not_list.json": json.dumps({"jobs": {"job": 1}}),
    "jobs_workers_map.json": json.dumps([dict(GOOD_JOB, workers={"host": "127.0.0.1"})]),
    "jobs_too_big.json": json.dumps([dict(GOOD_JOB, nlanes=4, block_size=1024)]),
    "jobs_lane_bits.json": json.dumps([dict(GOOD_JOB, lane_bits=12)]),
    "jobs_lane_bits_str.json": json.dumps([dict(GOOD_JOB, lane_bits="16")]),
    "l2_jobs_null.json": json.dumps({"jobs": [None]}),
    "l2_not_map.json": json.dumps([1, 2]),
    "l2_mtu_str.json": json.dumps({"mtu": "big"}),
    "daemon_bad_json.json": "{socket: 1}",
    "daemon_list.json": "[]",
    "daemon_unknown.json": json.dumps({"sockett": "/tmp/x.sock"}),
    "daemon_timeout_str.json": json.dumps({"timeout": "30"}),
    "daemon_timeout_bool.json": json.dumps({"timeout": True}),
    "daemon_rto_neg.json": json.dumps({"rto": -1}),
    "daemon_level.json": json.dumps({"log_level": "LOUD"}),
    "daemon_socket_int.json": json.dumps({"socket": 5}),
    "daemon_socket_dir.json": json.dumps({"socket": "/nonexistent-spina-dir/a.sock"}),
    "daemon_socket_long.json": json.dumps({"socket": "/tmp/" + "s" * 120}),
    "daemon_logfile_list.json": json.dumps({"log_file": ["a"]}),
}


def run_cli(module: str, args: list, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=60)


def assert_one_line_error(out: subprocess.CompletedProcess, names: str) -> None:
    """Exit 2, one non-empty stderr line that contains `names`, no traceback."""
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.rstrip("\n").split("\n")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert len(lines) == 1 and lines[0].strip(), out.stderr
    assert names in lines[0], f"{names!r} not named in: {lines[0]}"


@pytest.fixture
def files(tmp_path):
    """The FILES written into a temporary directory (the CLI's working directory)."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


# --------------------------------------------------------------------------- python -m softswitch
SOFTSWITCH_CASES = [
    (["udp", "--port", "70000"], "--port"),
    (["udp", "--port", "-1"], "--port"),
    (["udp", "--port", "http"], "--port"),
    (["udp", "--pool-slots", "0"], "--pool-slots"),
    (["udp", "--pool-slots", "-5"], "--pool-slots"),
    (["udp", "--pool-slots", "65536"], "--pool-slots/--slot-capacity"),  # 8 GiB of registers
    (["udp", "--pool-slots", "4096", "--slot-capacity", "1000000"], "--slot-capacity"),
    (["udp", "--slot-capacity", "0"], "--slot-capacity"),
    (["udp", "--datapath-threads", "0"], "--datapath-threads"),
    (["udp", "--datapath-threads", "two"], "--datapath-threads"),
    (["udp", "--datapath-threads", "2", "--datapath", "python"], "--datapath-threads"),
    (["udp", "--slot-capacity", "99999999999"], "--slot-capacity"),
    (["udp", "--device-id", "-1"], "--device-id"),
    (["udp", "--port", "0", "--grpc", "127.0.0.1:99999"], "--grpc"),
    (["udp", "--port", "0", "--grpc", "127.0.0.1:x"], "--grpc"),
    (["udp", "--port", "0", "--grpc", "0.0.0.0:9559"], "--grpc"),
    (["udp", "--port", "0", "--grpc", "127.0.0.1:0", "--jobs", "jobs_null.json"], "--grpc"),
    (["udp", "--host", "no-such-host.invalid"], "--host"),
    (["udp", "--host", "192.0.2.1", "--port", "0"], "--host"),  # TEST-NET: not ours
    (["udp", "--port", "0", "--jobs", "missing.json"], "missing.json"),
    (["udp", "--port", "0", "--jobs", "jobs_syntax.json"], "jobs_syntax.json"),
    (["udp", "--port", "0", "--jobs", "jobs_syntax.yaml"], "jobs_syntax.yaml"),
    (["udp", "--port", "0", "--jobs", "jobs_null.json"], "jobs[0]"),
    (["udp", "--port", "0", "--jobs", "jobs_null_worker.json"], "workers[0]"),
    (["udp", "--port", "0", "--jobs", "jobs_dup_worker.json"], "workers[1].port"),
    (["udp", "--port", "0", "--jobs", "jobs_dup_job.json"], "jobs[1]: field 'job'"),
    (["udp", "--port", "0", "--jobs", "jobs_float_nslots.json"], "nslots"),
    (["udp", "--port", "0", "--jobs", "jobs_str_nslots.yaml"], "nslots"),
    (["udp", "--port", "0", "--jobs", "jobs_big_port.json"], "workers[0].port"),
    (["udp", "--port", "0", "--jobs", "jobs_name_host.json"], "workers[0].host"),
    (["udp", "--port", "0", "--jobs", "jobs_not_list.json"], "jobs_not_list.json"),
    (["udp", "--port", "0", "--jobs", "jobs_workers_map.json"], "workers"),
    (["udp", "--port", "0", "--jobs", "jobs_lane_bits.json"], "field 'lane_bits'"),
    (["udp", "--port", "0", "--jobs", "jobs_lane_bits_str.json"], "lane_bits"),
    (["udp", "--port", "0", "--slot-capacity", "1024", "--jobs", "jobs_too_big.json"],
     "jobs[0]: job 1: field 'block_size'"),
    (["l2", "-i", "1@lo", "--config", "l2_jobs_null.json"], "jobs[0]"),
    (["l2", "-i", "1@lo", "--config", "l2_not_map.json"], "l2_not_map.json"),
    (["l2", "-i", "1@lo", "--config", "l2_mtu_str.json"], "mtu"),
    (["l2", "-i", "lo"], "--interface"),
    (["l2", "-i", "1@lo", "--queue-rate", "1"], "--queue-rate"),
    (["l2", "-i", "1@lo", "--queue-rate", "1:0"], "--queue-rate"),
    (["l2", "-i", "1@lo", "--queue-rate", "1:-5"], "--queue-rate"),
    (["l2", "-i", "1@lo", "--queue-rate", "x:100"], "--queue-rate"),
    (["l2", "-i", "1@lo", "--queue-rate", "2:100"], "--queue-rate: port 2"),
    (["udp", "--bogus"], "--bogus"),
    ([], "udp,l2"),
]


@pytest.mark.parametrize("args,names", SOFTSWITCH_CASES,
                         ids=[" ".join(a) for a, _ in SOFTSWITCH_CASES])
def test_softswitch_cli(args, names, files):
    """`python -m softswitch ARGS` exits 2 with one line naming the option, field or file."""
    assert_one_line_error(run_cli("softswitch", args, files), names)


# --------------------------------------------------------------------------- python -m testbed
# (argument checks only: these fail before mininet or root is needed)
TESTBED_CASES = [
    (["leafspine", "--spines", "0"], "--spines"),
    (["leafspine", "--two-level", "--spines", "9"], "--spines"),
    (["leafspine", "--leaves", "9", "--hosts-per-leaf", "4"], "--leaves/--hosts-per-leaf"),
    (["leafspine", "--loss", "1.5"], "--loss"),
    (["leafspine", "--density", "0"], "--density"),
    (["leafspine", "--spine-bytes", "--elements", "100"], "--elements"),
    (["single", "--two-level"], "--two-level"),
]


@pytest.mark.parametrize("args,names", TESTBED_CASES, ids=[" ".join(a) for a, _ in TESTBED_CASES])
def test_testbed_cli(args, names, files):
    """`python -m testbed ARGS` exits 2 with one line naming the option."""
    assert_one_line_error(run_cli("testbed", args, files), names)


# --------------------------------------------------------------------------- python -m host_agent
HOST_AGENT_CASES = [
    (["launch", "--nworkers", "0", "--job-file", "j.json"], "--nworkers"),
    (["launch", "--nworkers", "33", "--job-file", "j.json"], "--nworkers"),
    (["launch", "--nworkers", "two", "--job-file", "j.json"], "--nworkers"),
    (["launch", "--nworkers", "2"], "--job-file"),
    (["launch", "--nworkers", "2", "--job-file", "no-such-dir/j.json"], "--job-file"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--log-level", "LOUD"], "--log-level"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--job", "70000"], "--job"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--switch-port", "65536"],
     "--switch-port"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--host", "0.0.0.0"], "--host"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--host", "192.0.2.1"], "--host"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--host", "my-laptop"], "--host"),
    (["status", "--socket", "no-daemon.sock"], "--socket"),
    (["status", "--sockets", "x"], "--sockets"),
    (["daemon", "--config", "missing.json"], "missing.json"),
    (["daemon", "--config", "daemon_bad_json.json"], "daemon_bad_json.json"),
    (["daemon", "--config", "daemon_list.json"], "daemon_list.json"),
    (["daemon", "--config", "daemon_unknown.json"], "sockett"),
    (["daemon", "--config", "daemon_timeout_str.json"], "timeout"),
    (["daemon", "--config", "daemon_timeout_bool.json"], "timeout"),
    (["daemon", "--config", "daemon_rto_neg.json"], "rto"),
    (["daemon", "--config", "daemon_level.json"], "log_level"),
    (["daemon", "--config", "daemon_socket_int.json"], "socket"),
    (["daemon", "--config", "daemon_socket_dir.json"], "socket"),
    (["daemon", "--config", "daemon_socket_long.json"], "socket"),
    (["daemon", "--config", "daemon_logfile_list.json"], "log_file"),
    (["daemon", "--socket", "no-such-dir/a.sock"], "--socket"),
    (["daemon", "--log-file", "no-such-dir/d.log"], "--log-file"),
    (["daemon", "--frobnicate"], "--frobnicate"),
    (["launhc"], "launhc"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--lane-bits", "12"], "--lane-bits"),
    (["launch", "--nworkers", "2", "--job-file", "j.json", "--lane-bits", "x"], "--lane-bits"),
]


@pytest.mark.parametrize("args,names", HOST_AGENT_CASES,
                         ids=[" ".join(a) for a, _ in HOST_AGENT_CASES])
def test_host_agent_cli(args, names, files):
    """`python -m host_agent ARGS` exits 2 with one line naming the option, field or file."""
    assert_one_line_error(run_cli("host_agent", args, files), names)


# --------------------------------------------------------------------------- controller YAML
def _state() -> dict:
    return {
        "switches": [{"name": "s1", "target": "softswitch", "grpc": "127.0.0.1:1",
                      "ports": [0], "pool_slots": 64}],
        "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "udp_port": 50000 + i,
                     "switch_port": 0} for i in range(2)],
        "jobs": [{"id": 1, "members": ["w0", "w1"], "nslots": 4, "slot_base": 0}],
    }


def _set(path: str, value):
    """An edit of the desired state: `path` is dotted keys and list indexes (jobs.0.members)."""
    def edit(d):
        *head, last = path.split(".")
        for k in head:
            d = d[int(k)] if isinstance(d, list) else d[k]
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return edit


CONTROLLER_YAML_CASES = [
    (_set("switches.0.name", ["s1"]), "switches[0].name"),
    (_set("switches.0.name", {"a": 1}), "switches[0].name"),
    (_set("switches.0.target", ["softswitch"]), "switches[0].target"),
    (_set("switches.0.grpc", ["127.0.0.1:1"]), "switches[0].grpc"),
    (_set("switches.0.grpc", "127.0.0.1:70000"), "switches[0].grpc"),
    (_set("switches.0.ports", [True]), "switches[0].ports"),
    (_set("switches.0.pool_slots", "64"), "switches[0].pool_slots"),
    (_set("switches.0.address", 5), "switches[0].address"),
    (_set("switches.0.p4info", ["a"]), "switches[0].p4info"),
    (_set("switches.0.l2", {"mac": "02:00:00:00:00:01", "port": 1}), "switches[0].l2"),
    (_set("switches.0.routes", [{"prefix": ["10.0.0.0/8"], "port": 1,
                                 "src_mac": "02:00:00:00:00:01", "dst_mac": "02:00:00:00:00:02"}]),
     "switches[0].routes[0].prefix"),
    (_set("switches", {"name": "s1"}), "switches"),
    (_set("workers.0.name", ["w0"]), "workers[0].name"),
    (_set("workers.0.ip", ["127.0.0.1"]), "workers[0].ip"),
    (_set("workers.0.ip", 2130706433), "workers[0].ip"),
    (_set("workers.0.udp_port", "50000"), "workers[0].udp_port"),
    (_set("workers.0.switch", ["s1"]), "workers[0].switch"),
    (_set("workers.0.mac", 2), "workers[0].mac"),
    (_set("workers.0.rank", True), "workers[0].rank"),
    (_set("workers", None), "workers"),
    (_set("jobs.0.members", [["w0"], "w1"]), "jobs[0].members[0]"),
    (_set("jobs.0.members", "w0,w1"), "jobs[0].members"),
    (_set("jobs.0.id", "1"), "jobs[0].id"),
    (_set("jobs.0.nslots", 2.5), "jobs[0].nslots"),
    (_set("jobs.0.bounded_loss", "high"), "jobs[0].bounded_loss"),
    (_set("jobs.0.lane_bits", 12), "lane_bits"),
    (_set("jobs.0.lane_bits", "8"), "jobs[0].lane_bits"),
    (_set("jobs.0", None), "jobs[0]"),
    (_set("agents_dir", ["agents"]), "agents_dir"),
    (_set("rendezvous", "0.0.0.0:47100"), "rendezvous"),
    (_set("rendezvous", "controller:47100"), "rendezvous"),
    (_set("rendezvous", "127.0.0.1:99999"), "rendezvous"),
    (_set("rendezvous", ["127.0.0.1", 47100]), "rendezvous"),
]


@pytest.mark.parametrize("edit,names", CONTROLLER_YAML_CASES,
                         ids=[n for _, n in CONTROLLER_YAML_CASES])
def test_controller_yaml(edit, names, tmp_path):
    """`python -m controller -c BAD.yaml status` exits 2 with one line naming the field."""
    doc = _state()
    edit(doc)
    (tmp_path / "spina.yaml").write_text(yaml.safe_dump(doc))
    out = run_cli("controller", ["-c", "spina.yaml", "--timeout", "1", "status"], tmp_path)
    assert_one_line_error(out, names)


@pytest.mark.parametrize("args,names", [(["serve", "--watch", "-1"], "--watch"),
                                        (["deploy", "--watch", "0"], "--watch"),
                                        (["serve", "--watch", "often"], "--watch")])
def test_controller_watch_option(args, names, tmp_path):
    """`serve`/`deploy --watch` with a non-positive or non-number period: one line naming it."""
    (tmp_path / "spina.yaml").write_text(yaml.safe_dump(_state()))
    assert_one_line_error(run_cli("controller", ["-c", "spina.yaml", *args], tmp_path), names)


@pytest.mark.parametrize("text,names", [("switches: [", "spina.yaml: not YAML"),
                                        ("- 1\n- 2\n", "(top)")])
def test_controller_yaml_unparsable(text, names, tmp_path):
    """A file that is not YAML, or not a mapping, is one line naming the file or the top."""
    (tmp_path / "spina.yaml").write_text(text)
    assert_one_line_error(run_cli("controller", ["-c", "spina.yaml", "status"], tmp_path), names)


# --------------------------------------------------------------------------- daemon protocol
def frame(obj) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack("!I", len(body)) + body


def exchange(path: str, data: bytes, sock=None):
    """Send `data` and read one reply frame (None if the daemon hung up)."""
    s = sock or socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if sock is None:
        s.connect(path)
    s.settimeout(10)
    s.sendall(data)
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return s, None
    (n,) = struct.unpack("!I", head)
    return s, json.loads(s.recv(n, socket.MSG_WAITALL))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """(socket path, job files by name) of a Daemon serving on a thread of this process."""
    d = tmp_path_factory.mktemp("daemon")
    job_files = {}
    for name, host in (("good", "127.0.0.1"), ("wildcard", "0.0.0.0"),
                       ("foreign", "192.0.2.1")):
        ports = free_ports(2)
        job = JobConfig(job=5, workers=tuple(WorkerAddr(r, host, p) for r, p in enumerate(ports)),
                        nslots=2, block_size=32, nlanes=4)
        job_files[name] = str(d / f"{name}.json")
        JobFile(job, ("127.0.0.1", 47999)).write(job_files[name])
    (d / "list.json").write_text("[]")
    job_files["list"] = str(d / "list.json")
    dm = Daemon(DaemonConfig(socket=str(d / "agent.sock"), timeout=1.0))
    t = threading.Thread(target=dm.serve_forever, daemon=True)
    t.start()
    yield str(d / "agent.sock"), job_files
    dm.stop()
    t.join(timeout=5)


DAEMON_PROTOCOL_CASES = [
    (b"[1, 2]", "JSON object"),
    (b'"attach"', "JSON object"),
    (b"42", "JSON object"),
    (b"null", "JSON object"),
    (b"\xff\xfe not json", "not JSON"),
    (b"{\"op\": ", "not JSON"),
    (b"[" * 100_000, "not JSON"),                    # RecursionError in json.loads
    ({}, "field 'op'"),
    ({"op": "frobnicate"}, "field 'op'"),
    ({"op": ["attach"]}, "field 'op'"),
    ({"op": "status", "verbose": 1}, "unknown field 'verbose'"),
    ({"op": "attach", "rank": 0}, "field 'job_file'"),
    ({"op": "attach", "job_file": "{good}"}, "field 'rank'"),
    ({"op": "attach", "job_file": "{good}", "rank": "0"}, "field 'rank'"),
    ({"op": "attach", "job_file": "{good}", "rank": True}, "field 'rank'"),
    ({"op": "attach", "job_file": "{good}", "rank": 1.0}, "field 'rank'"),
    ({"op": "attach", "job_file": 7, "rank": 0}, "field 'job_file'"),
    ({"op": "attach", "job_file": "{good}", "rank": 0, "pid": "me"}, "field 'pid'"),
    ({"op": "attach", "job_file": "{good}", "rank": 9}, "rank 9"),
    ({"op": "attach", "job_file": "/nonexistent/job.json", "rank": 0}, "/nonexistent/job.json"),
    ({"op": "attach", "job_file": "{list}", "rank": 0}, "job file"),
    ({"op": "attach", "job_file": "{wildcard}", "rank": 0}, "workers[0].host"),   # defect 4
    ({"op": "attach", "job_file": "{foreign}", "rank": 1}, "workers[1].host"),
    ({"op": "allreduce", "shm": "x", "n": 1, "dtype": "float32"}, "before attach"),
    ({"op": "allreduce", "shm": ["x"], "n": 1, "dtype": "float32"}, "field 'shm'"),
    ({"op": "allreduce", "shm": "x", "n": "1", "dtype": "float32"}, "field 'n'"),
    ({"op": "allreduce", "shm": "x", "n": 1}, "field 'dtype'"),
    ({"op": "allgather", "shm": "x", "n": 1}, "before attach"),
    ({"op": "allgather", "shm": "x", "n": 1.5}, "field 'n'"),
    ({"op": "allgather", "n": 1}, "field 'shm'"),
    ({"op": "allgather", "shm": "x", "n": 1, "dtype": "float32"}, "field 'dtype'"),
]


def _fill(obj, job_files):
    if isinstance(obj, dict):
        return {k: v.format(**job_files) if isinstance(v, str) else v for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("request_,names", DAEMON_PROTOCOL_CASES,
                         ids=[repr(r)[:40] for r, _ in DAEMON_PROTOCOL_CASES])
def test_daemon_protocol(request_, names, daemon):
    """A bad request gets an error reply naming the field; the connection and daemon go on."""
    path, job_files = daemon
    s, reply = exchange(path, frame(_fill(request_, job_files)))
    with s:
        assert reply is not None and reply["ok"] is False, reply
        assert names in reply["error"], reply["error"]
        _, again = exchange(path, frame({"op": "status"}), sock=s)  # same connection
        assert again["ok"] is True, again
    s2, fresh = exchange(path, frame({"op": "status"}))  # a new connection too
    s2.close()
    assert fresh["ok"] is True


def test_daemon_protocol_oversized_length(daemon):
    """A length beyond MAX_MESSAGE: an error reply, the connection closes, the daemon serves on."""
    path, _ = daemon
    s, reply = exchange(path, struct.pack("!I", MAX_MESSAGE + 1))
    with s:
        assert reply["ok"] is False and "exceeds" in reply["error"]
        assert s.recv(1) == b"", "the daemon hangs up: the stream's framing is lost"
    s2, fresh = exchange(path, frame({"op": "status"}))
    s2.close()
    assert fresh["ok"] is True


def test_daemon_attach_good_job_file_still_works(daemon):
    """The good job file attaches (the checks above refuse only what is bad)."""
    path, job_files = daemon
    s, reply = exchange(path, frame({"op": "attach", "job_file": job_files["good"], "rank": 0,
                                     "pid": os.getpid()}))
    s.close()
    assert reply["ok"] is True and reply["job"]["job"]["job"] == 5


# --------------------------------------------------------------------------- defect 4: agent bind
@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "224.0.0.1"])
def test_agent_binds_only_a_local_specific_address(host):
    """An Agent refuses a wildcard, foreign or multicast worker address, naming the field."""
    job = JobConfig(job=3, workers=(WorkerAddr(0, host, free_ports(1)[0]),), nslots=2,
                    block_size=32, nlanes=4)
    with pytest.raises(ConfigError, match=r"workers\[0\]\.host"):
        Agent(job, 0, ("127.0.0.1", 47999))


# ----------------------------------------------------------------------- job and assignment files
def _job_file(**changes) -> dict:
    d = {"switch": {"host": "127.0.0.1", "port": 47000}, "job": copy.deepcopy(GOOD_JOB),
         "rendezvous": {"host": "127.0.0.1", "port": 47100}}
    for path, value in changes.items():
        _set(path.replace("__", "."), value)(d)
    return d


JOBFILE_CASES = [
    (_job_file(job__workers={"host": "127.0.0.1"}), "field 'workers'"),
    (_job_file(job__workers=None), "field 'workers'"),
    (_job_file(job__workers__0=None), "workers[0]"),
    (_job_file(job__workers__0=["127.0.0.1", 50000]), "workers[0]"),
    (_job_file(job__workers__1={"host": "127.0.0.1"}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": "50001"}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": 70000}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": 0}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": True}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": 50001.0}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "node1", "port": 50001}), "workers[1].host"),
    (_job_file(job__workers__1={"host": 2130706433, "port": 50001}), "workers[1].host"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": 50000}), "workers[1].port"),
    (_job_file(job__workers__1={"host": "127.0.0.1", "port": 50001, "hots": 1}),
     "workers[1].hots"),
    (_job_file(job__job=True), "'job'"),
    (_job_file(job__job="1"), "'job'"),
    (_job_file(job__nslots=2.5), "nslots"),
    (_job_file(job__nslots=False), "nslots"),
    (_job_file(job__epoch="1"), "epoch"),
    (_job_file(job__bounded_loss="0.1"), "bounded_loss"),
    (_job_file(job__bounded_loss=True), "bounded_loss"),
    (_job_file(job__lane_bits=24), "field 'lane_bits'"),
    (_job_file(job__lane_bits=16.0), "lane_bits"),
    (_job_file(job__colour="red"), "colour"),
    (_job_file(job=None), "job: a job must be a mapping"),
    (_job_file(job=[1]), "job: a job must be a mapping"),
    (_job_file(switch=None), "field 'switch'"),
    (_job_file(switch={"host": "127.0.0.1", "port": "47000"}), "switch.port"),
    (_job_file(switch={"host": "127.0.0.1", "port": 65536}), "switch.port"),
    (_job_file(switch={"host": "switch1", "port": 47000}), "switch.host"),
    (_job_file(switch={"host": "127.0.0.1"}), "switch.port"),
    ([], "top level"),
    (dict(_job_file(), rank="0"), "rank"),
    (dict(_job_file(), rank=True), "rank"),
    (dict(_job_file(), rank=2), "rank"),
    (_job_file(rendezvous=None), "field 'rendezvous'"),
    (_job_file(rendezvous={"host": "127.0.0.1", "port": 0}), "rendezvous.port"),
    (_job_file(rendezvous={"host": "launcher", "port": 47100}), "rendezvous.host"),
    (_job_file(rendezvous={"host": "127.0.0.1", "port": "47100"}), "rendezvous.port"),
    # issue 44 item 8: no rendezvous is a choice the file states, never an omission
    ({k: v for k, v in _job_file().items() if k != "rendezvous"},
     "field 'rendezvous' is missing: without it every run uses the file's epoch"),
    (_job_file(epochs="caller"), "field 'epochs'"),
    (dict({k: v for k, v in _job_file().items() if k != "rendezvous"}, epochs="manual"),
     "field 'epochs': 'manual'"),
]


@pytest.mark.parametrize("doc,names", JOBFILE_CASES, ids=[n for _, n in JOBFILE_CASES])
def test_job_and_assignment_files(doc, names, tmp_path):
    """A bad job (or assignment) file is a one-line ConfigError naming the file and the field."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    is_assignment = isinstance(doc, dict) and "rank" in doc
    with pytest.raises(ConfigError) as e:
        Assignment.load(path) if is_assignment else JobFile.load(path)
    msg = str(e.value)
    assert names in msg and str(path) in msg and "\n" not in msg, msg


def test_job_file_good_input_unchanged(tmp_path):
    """The good job file and assignment load to the values written (nothing converted)."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps(dict(_job_file(), rank=1)))
    a = Assignment.load(path)
    assert (a.rank, a.switch, a.job.workers[1].port, a.job.nslots) == (1, ("127.0.0.1", 47000),
                                                                      50001, 4)
    # without a rendezvous, saying that the caller manages the epochs: loads, and says so again
    doc = {k: v for k, v in _job_file().items() if k != "rendezvous"}
    path.write_text(json.dumps(dict(doc, epochs="caller")))
    jf = JobFile.load(path)
    assert jf.rendezvous is None and jf.to_dict()["epochs"] == "caller"


# --------------------------------------------------------------------------- run rendezvous
RENDEZVOUS_CASES = [
    (b"not json\n", "not JSON"),
    (b"[1, 2]\n", "expected {\"op\": \"join\""),
    (b"\"join\"\n", "expected {\"op\": \"join\""),
    (b'{"op": "leave"}\n', "expected {\"op\": \"join\""),
    (b'{"op": "join", "job": "1", "rank": 0, "nworkers": 2}\n', "field 'job'"),
    (b'{"op": "join", "job": 1, "rank": true, "nworkers": 2}\n', "field 'rank'"),
    (b'{"op": "join", "job": 1, "rank": 0}\n', "field 'nworkers'"),
    (b'{"op": "join", "job": 9, "rank": 0, "nworkers": 2}\n', "job 9 is not served here"),
    (b'{"op": "join", "job": 1, "rank": 0, "nworkers": 3}\n', "job 1 has 2 workers"),
    (b'{"op": "join", "job": 1, "rank": 2, "nworkers": 2}\n', "rank 2 outside 0..1"),
    (b"x" * 5000 + b"\n", "too long"),
]


@pytest.fixture(scope="module")
def runs():
    """A run rendezvous serving job 1 (2 workers) on loopback; counts the runs it starts."""
    from spina.rendezvous import RendezvousServer
    started = []
    with RendezvousServer("127.0.0.1", 0, {1: (2, 1)}, lambda j, e: started.append((j, e))) as srv:
        yield srv, started


@pytest.mark.parametrize("line,names", RENDEZVOUS_CASES, ids=[n for _, n in RENDEZVOUS_CASES])
def test_rendezvous_protocol(line, names, runs):
    """A bad join gets one error reply naming the field; the server keeps serving and starts
    no run."""
    srv, started = runs
    with socket.create_connection(srv.address, timeout=10) as s:
        s.sendall(line)
        reply = json.loads(s.makefile("rb").readline())
    assert reply["ok"] is False and names in reply["error"], reply
    assert started == [] and srv.jobs[1].waiting == {}


# --------------------------------------------------------------------------- typed config mappings
# spina.fields.dataclass_kwargs reads the compression and PS policy mappings (YAML/JSON).
TYPED_CASES = [
    ("compression", {"ratio": "0.1"}, "compression: field 'ratio': '0.1' is not a number"),
    ("compression", {"warmup_steps": 1.5},
     "compression: field 'warmup_steps': 1.5 is not an integer"),
    ("compression", {"error_feedback": 1},
     "compression: field 'error_feedback': 1 is not a boolean"),
    ("compression", {"ratio": True}, "compression: field 'ratio': True is not a number"),
    ("compression", {"ratoi": 0.1}, "compression: unknown field 'ratoi'"),
    ("compression", [0.1], "compression: must be a mapping"),
    ("ps", {"staleness": True}, "ps policy: field 'staleness': True is not an integer"),
    ("ps", {"policy": 3}, "ps policy: field 'policy': 3 is not a string"),
]


@pytest.mark.parametrize("what,doc,message", TYPED_CASES, ids=[c[2].split(":")[1] + str(i)
                                                               for i, c in enumerate(TYPED_CASES)])
def test_typed_config_mappings(what, doc, message):
    from host_agent.compression import CompressionConfig
    from ps.config import PolicyConfig
    cls = CompressionConfig if what == "compression" else PolicyConfig
    with pytest.raises(ConfigError) as e:
        cls.from_dict(doc)
    assert str(e.value).startswith(message)


def test_typed_config_good_values():
    """Integers are taken for floats (as floats), None where the field allows it."""
    from host_agent.compression import CompressionConfig
    c = CompressionConfig.from_dict({"ratio": 1, "ratio_min": None, "warmup_steps": 0})
    assert c.ratio == 1.0 and isinstance(c.ratio, float) and c.ratio_min is None


# ------------------------------------------------------- every option of every command (Build 4)
# The options come from the argparse parsers themselves (spina_cli.main.PARSERS, the example
# scripts' parser()), so an option added anywhere is fed the bad values its type declares
# (spina.cli.refuses); an option whose type declares none (a bare int, float or free text)
# fails here until it gets a type from spina/cli.py.
NO_SUCH_CHOICE = "no-such-choice"
# commands whose parser is not in PARSERS, each with the reason (printed by the test)
NOT_WALKED: dict[str, str] = {}


def _parser_of(ref: str, prog: str) -> argparse.ArgumentParser:
    module, function = ref.split(":")
    return getattr(importlib.import_module(module), function)(prog)


def _walk(parser: argparse.ArgumentParser, words: tuple = ()):
    """(subcommand words, action) of every option and positional that takes a value."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from _walk(sub, words + (word,))
        elif not (action.option_strings and action.nargs == 0):  # flags take no value
            yield words, action


def _commands():
    """(prog, parser) of every `spina` command, with the prog spina_cli.main gives it."""
    for name, ref in PARSERS.items():
        prog = ("spina" if ref.startswith("controller.")  # its parser's subcommands: deploy ...
                else "spina status" if name == "status --watch" else f"spina {name}")
        yield prog, _parser_of(ref, prog)


# The other command lines a user types: each module's parser(prog).
MODULE_PARSERS = {"python -m ps": "ps.__main__:parser",
                  "python -m testbed": "testbed.__main__:parser",
                  "python -m bench.compression_trace": "bench.compression_trace:parser",
                  "python -m bench.targets": "bench.targets:parser"}


def _scripts():
    """(prog, parser) of every example script with options (each defines parser())."""
    for path in sorted((ROOT / "examples").glob("*.py")):
        if "ArgumentParser" in path.read_text():
            module = importlib.import_module(f"examples.{path.stem}")
            assert hasattr(module, "parser"), f"{path}: define parser() (its options are walked)"
            yield f"examples/{path.name}", module.parser()


def _all_parsers():
    yield from _commands()
    for prog, ref in MODULE_PARSERS.items():
        yield prog, _parser_of(ref, prog)
    yield from _scripts()


def _option_cases():
    cases = []
    for prog, parser in _all_parsers():
        for words, action in _walk(parser):
            label = " ".join((prog, *words, "/".join(action.option_strings) or action.dest))
            bad = tuple(getattr(action.type, "bad_values", ()))
            if action.choices is not None:
                bad += (NO_SUCH_CHOICE,)
            cases.append(pytest.param(parser, words, action, bad, id=label))
    return cases


def _name(action) -> str:
    """How argparse names the action in its errors."""
    if action.option_strings:
        return "/".join(action.option_strings)
    return action.metavar or action.dest


@pytest.mark.parametrize("parser,words,action,bad", _option_cases())
def test_every_option_refuses_bad_values(parser, words, action, bad, tmp_path, monkeypatch):
    """Each bad value of the option's type: exit 2, one line `PROG: error: argument OPT: ...`,
    decided while parsing (so before the command starts anything)."""
    assert bad, (f"{_name(action)} takes any text: give it a type from spina/cli.py that "
                 "declares the values it refuses (cli.refuses), or choices")
    monkeypatch.chdir(tmp_path)  # relative paths (no-such-file.json) are nobody's
    for value in bad:
        argv = [*words] + ([action.option_strings[-1], value] if action.option_strings
                           else [value])
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        lines = err.getvalue().rstrip("\n").split("\n")
        assert e.value.code == 2 and len(lines) == 1, (argv, err.getvalue())
        assert f": error: argument {_name(action)}: " in lines[0], (argv, lines[0])
        assert lines[0].startswith(("spina", "python -m", "examples/")), lines[0]


def test_every_command_has_its_parser_walked():
    """Every command `spina --help` lists is in spina_cli.main.PARSERS (or says why not)."""
    walked = {name.split()[0] for name in PARSERS} | {"serve", "status", "job", "reset"}
    for name, why in NOT_WALKED.items():
        print(f"spina {name}: options not walked: {why}")
    assert set(COMMANDS) - walked == set(NOT_WALKED)


def test_each_spina_command_answers_with_its_parser(tmp_path):
    """Through the real `spina` process, each command refuses its first option's first bad
    value with the line its parser gives in-process (so PARSERS is what `spina` runs, under
    the name the user typed)."""
    seen = set()
    for case in _option_cases():
        parser, words, action, bad = case.values
        key = (parser.prog, words[:1])  # each subcommand too (udp, l2; deploy, serve, ...)
        if (not bad or key in seen or parser.prog == "spina" and not words
                or not parser.prog.startswith("spina")):
            continue  # (`spina` takes the controller's options after the command only)
        seen.add(key)
        head = parser.prog.split()[1:]  # the words after `spina`
        argv = [*head, *words] + ([action.option_strings[-1], bad[0]] if action.option_strings
                                  else [bad[0]])
        if head == ["status"] and "--watch" not in argv:
            argv += ["--watch", "1"]  # spina_cli.status: the live table's parser
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            parser.parse_args([*words] + argv[len(head) + len(words):])
        out = run_cli("spina_cli", argv, tmp_path)
        assert (out.returncode, out.stdout, out.stderr) == (2, "", err.getvalue()), argv
    assert len({prog for prog, _ in seen}) == len(PARSERS), seen


# The inputs issue 44 found late or as tracebacks: through the real process, one line, exit 2,
# nothing printed on stdout (nothing started).
SPINA_CASES = [
    (["status", "--timeout", "-1"], "argument --timeout: '-1' must be a positive number"),
    (["status", "--watch", "1", "--count", "0"], "argument --count: 0 is less than 1"),
    (["demo", "--workers", "0"], "argument --workers: 0 is not in 1..32"),
    (["demo", "--elements", "-5"], "argument --elements: -5 is not in 1..4294967295"),
    (["demo", "--densities", "2", "-1"], "argument --densities: '2' must be in [0, 1]"),
    (["demo", "--densities", "2"], "argument --densities: '2' must be in [0, 1]"),
    (["demo", "--block-size", "1024", "--nlanes", "60"],
     "--block-size/--nlanes: 60 lanes of 1024 elements exceed a UDP datagram; at most 15 fit"),
    (["demo", "--metrics", "0.0.0.0:9100"], "argument --metrics: metrics address"),
    (["deploy", "--election-id", "0"], "argument --election-id: 0 is not in 1..2**128-1"),
    (["switch", "udp", "--metrics", "0.0.0.0:1"], "spina switch udp: error: argument --metrics"),
    (["agent", "launch", "--nworkers", "2", "--job-file", "j.json", "--metrics", "x"],
     "spina agent launch: error: argument --metrics"),
]


@pytest.mark.parametrize("args,said", SPINA_CASES, ids=[" ".join(a) for a, _ in SPINA_CASES])
def test_spina_refuses_before_starting(args, said, tmp_path):
    """`spina ARGS`: exit 2, one line (stdout empty: no switch, no worker started)."""
    out = run_cli("spina_cli", args, tmp_path)
    assert_one_line_error(out, said)
    assert out.stdout == "" and out.stderr.startswith(f"spina {args[0]}"), out


@pytest.mark.parametrize("flag", ["--grpc", "--metrics"])
def test_switch_with_a_busy_address_says_one_line(flag, tmp_path):
    """A P4Runtime or metrics address in use: one line naming the option and who holds the
    address (this test's process), and no `listening` line before it (every address is bound
    before anything is printed)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        value = f"127.0.0.1:{port}" if flag == "--grpc" else str(port)
        out = run_cli("spina_cli", ["switch", "udp", "--port", "0", flag, value], tmp_path)
    assert_one_line_error(out, f"spina switch udp: error: argument {flag}: ")
    what = "P4Runtime port" if flag == "--grpc" else "metrics port"
    assert f"127.0.0.1:{port} ({what}) is held by pid {os.getpid()}: " in out.stderr
    assert out.stdout == ""


POLICIES = {"unknown.json": '{"policy": "fifo"}', "negative.json": '{"staleness": -3}',
            "text.json": "staleness: 3"}


@pytest.mark.parametrize("role", ["coordinator", "shard"])
@pytest.mark.parametrize("policy,said", [
    ("unknown.json", "field 'policy': 'fifo' is not one of bsp, asp, ssp, gssp"),
    ("negative.json", "field 'staleness': must be >= 0 clocks"),
    ("text.json", "not JSON"),
])
def test_ps_bad_policy_file(role, policy, said, tmp_path):
    """`python -m ps ROLE --policy BAD`: one line naming --policy, the file and the field."""
    (tmp_path / policy).write_text(POLICIES[policy])
    extra = ["--index", "0", "--size", "4"] if role == "shard" else []
    out = run_cli("ps", [role, "--nworkers", "1", *extra, "--policy", policy], tmp_path)
    assert_one_line_error(out, f"python -m ps {role}: error: argument --policy: {policy}: ")
    assert said in out.stderr


def test_ps_busy_port(tmp_path):
    """A port in use: one line naming it and who holds it (no gRPC log lines before it)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = run_cli("ps", ["coordinator", "--nworkers", "1", "--port", str(port)], tmp_path)
    assert_one_line_error(out, f"cannot serve the coordinator: 127.0.0.1:{port} (the "
                               f"coordinator port) is held by pid {os.getpid()}: ")


def test_one_rank_with_its_address_taken(tmp_path):
    """examples/one_rank.py whose rank's UDP port is held: one line naming the field, the
    address and who holds it, exit 2 (was an OSError traceback)."""
    ports = free_ports(2)
    job = JobConfig(job=1, workers=tuple(WorkerAddr(r, "127.0.0.1", p)
                                         for r, p in enumerate(ports)),
                    nslots=2, block_size=32, nlanes=4)
    path = tmp_path / "rank1.json"
    JobFile(job, ("127.0.0.1", 47999), ("127.0.0.1", 47998)).write(str(path))
    path.write_text(json.dumps(dict(json.loads(path.read_text()), rank=1)))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", ports[1]))
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "one_rank.py"), str(path)],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
    assert_one_line_error(out, f"examples/one_rank.py: error: job 1: field 'workers[1].host': "
                               f"127.0.0.1:{ports[1]} (the worker's port) is held by pid "
                               f"{os.getpid()}: ")


def test_each_example_answers_with_its_parser(tmp_path):
    """`python examples/X.py OPT BAD` (the first option of each script with a declared bad
    value): the line its parser gives in-process, exit 2, nothing on stdout."""
    done = set()
    for case in _option_cases():
        parser, words, action, bad = case.values
        if not parser.prog.startswith("examples/") or parser.prog in done or not bad:
            continue
        done.add(parser.prog)
        argv = ([action.option_strings[-1], bad[0]] if action.option_strings else [bad[0]])
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            parser.parse_args(argv)
        out = subprocess.run([sys.executable, str(ROOT / parser.prog), *argv], cwd=tmp_path,
                             env=ENV, capture_output=True, text=True, timeout=120)
        assert (out.returncode, out.stdout, out.stderr) == (2, "", err.getvalue()), argv
    assert len(done) == len(list(_scripts()))


def test_job_file_type_checks_this_ranks_file(tmp_path, monkeypatch):
    """cli.job_file: `{rank}` stands for $RANK (as agent_from_env reads it), so a template
    whose rank's file exists passes and one whose does not is refused naming that file;
    without $RANK a template is left to agent_from_env."""
    (tmp_path / "job3-rank1.json").write_text("{}")
    template = str(tmp_path / "job3-rank{rank}.json")
    monkeypatch.setenv("RANK", "1")
    assert cli.job_file(template) == template
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(argparse.ArgumentTypeError, match="job3-rank2.json: no such file"):
        cli.job_file(template)
    monkeypatch.delenv("RANK")
    assert cli.job_file(template) == template
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        cli.job_file(str(tmp_path / "job3-rank0.json"))
