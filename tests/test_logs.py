"""One log format for every process (spina/log.py): --log-format text|kv|json, job/call/rank fields.

Run just this file: .venv/bin/python -m pytest tests/test_logs.py

The process tests run the real launcher (a software switch and the run rendezvous in one
process) and the real host agent daemon as subprocesses, make calls through the daemon, and
parse every line each wrote: a JSON object per line, or key=value pairs read by the logfmt
parser below (written here, not taken from spina/log.py, so it checks the format from outside).
"""
import concurrent.futures
import datetime
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from host_agent.agent import SpinaError
from host_agent.daemon.client import DaemonClient, status
from spina import log as spina_log
from tests.waits import until

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^ "=]*)(?: |$)')
_UNESCAPE = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(m) -> str:
    e = m.group(1)
    return chr(int(e[1:], 16)) if len(e) == 5 else _UNESCAPE[e]


def parse_logfmt(line: str) -> dict:
    """key=value pairs separated by one space; a quoted value has \\" \\\\ \\n \\r \\t \\uXXXX
    escapes.
    Raises ValueError if any part of the line is not such a pair."""
    out, pos = {}, 0
    while pos < len(line):
        m = _PAIR.match(line, pos)
        if m is None:
            raise ValueError(f"not logfmt at column {pos}: {line!r}")
        key, value = m.groups()
        if value.startswith('"'):
            value = re.sub(r"\\(u[0-9a-f]{4}|.)", _unescape, value[1:-1])
        if key in out:
            raise ValueError(f"key {key!r} twice: {line!r}")
        out[key] = value
        pos = m.end()
    return out


def parse_lines(text: str, fmt: str) -> list[dict]:
    """Every line of a log as a dict (values as strings for kv); fails on any line that is not."""
    lines = text.splitlines()
    assert lines, "the process wrote no log lines"
    return [json.loads(x) if fmt == "json" else parse_logfmt(x) for x in lines]


def check_common_fields(records: list[dict], proc: str) -> None:
    """ts, level, proc, pid, logger and msg on every line, in that order, with sane values."""
    now = datetime.datetime.now(datetime.timezone.utc)
    for r in records:
        assert list(r)[:6] == ["ts", "level", "proc", "pid", "logger", "msg"], r
        assert TS.fullmatch(r["ts"]), r
        t = datetime.datetime.strptime(r["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc)
        assert abs((now - t).total_seconds()) < 3600, r  # UTC, not local time
        assert r["level"] in ("debug", "info", "warning", "error", "critical"), r
        assert r["proc"] == proc and int(r["pid"]) > 0 and r["logger"].startswith("spina."), r


@pytest.mark.parametrize("fmt", ["json", "kv"])
def test_launcher_and_daemon_lines_parse_and_call_lines_carry_job_call_rank(tmp_path, fmt):
    """A launcher (switch + rendezvous) and a daemon with --log-format FMT: every line parses with
    ts/level/proc/pid/logger/msg; each call's line carries job, call and rank (2 good calls per
    rank at DEBUG, then a rank-0 call that times out at WARNING with call=3)."""
    job_file, sock = tmp_path / "job.json", tmp_path / "agent.sock"
    launch_log, daemon_log = tmp_path / "launch.log", tmp_path / "daemon.log"
    (tmp_path / "daemon.json").write_text(json.dumps({"timeout": 2, "rto": 0.05}))
    with open(launch_log, "w") as err:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "host_agent.launch", "--nworkers", "2", "--job", "7",
             "--job-file", str(job_file), "--log-format", fmt], stderr=err, env=ENV, cwd=ROOT)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "host_agent", "daemon", "--config", str(tmp_path / "daemon.json"),
         "--socket", str(sock), "--log-file", str(daemon_log), "--log-format", fmt,
         "--log-level", "DEBUG"], env=ENV, cwd=ROOT)
    try:
        until(lambda: job_file.exists() and sock.exists(), "the job file and the socket")
        with DaemonClient(str(job_file), 0, str(sock)) as c0, \
                DaemonClient(str(job_file), 1, str(sock)) as c1, \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(2):
                outs = [f.result(timeout=60) for f in
                        [pool.submit(c.allreduce, np.full(600, r + 1.0, np.float32))
                         for r, c in enumerate((c0, c1))]]
                np.testing.assert_array_equal(outs[0], np.full(600, 3.0, np.float32))
            with pytest.raises(SpinaError, match="SpinaTimeout"):
                c0.allreduce(np.ones(600, np.float32))  # rank 1 never calls
        assert status(str(sock))["calls_done"] == 5
    finally:
        for p in (daemon, launcher):
            p.send_signal(signal.SIGTERM)
        rcs = [p.wait(timeout=20) for p in (daemon, launcher)]
    assert rcs == [0, 0]

    launched = parse_lines(launch_log.read_text(), fmt)
    check_common_fields(launched, "launch")
    start = [r for r in launched if r["logger"] == "spina.launch" and "switch on" in r["msg"]]
    assert len(start) == 1 and str(start[0]["job"]) == "7" and str(start[0]["epoch"]) == "1"
    assert any(r["logger"] == "spina.softswitch" and r["msg"].startswith("job 7 admitted")
               for r in launched), "the switch's own lines, in the same format"

    records = parse_lines(daemon_log.read_text(), fmt)
    check_common_fields(records, "daemon")
    calls = [r for r in records if "call" in r]
    for r in calls:
        order = [k for k in list(r)[6:10] if k != "epoch"]  # epoch: where a line knows it
        assert str(r["job"]) == "7" and order == ["job", "call", "rank"], r
    done = sorted((str(r["rank"]), str(r["call"])) for r in calls
                  if r["msg"].startswith("call done: 600 elements"))
    assert done == [("0", "1"), ("0", "2"), ("1", "1"), ("1", "2")]
    assert all(r["level"] == "debug" for r in calls if r["msg"].startswith("call done"))
    failed = [r for r in calls if r["msg"].startswith("call failed: SpinaTimeout")]
    assert [(r["level"], str(r["rank"]), str(r["call"])) for r in failed] == [("warning", "0", "3")]
    attached = [r for r in records if r["msg"] == "client attached"]
    assert sorted(str(r["rank"]) for r in attached) == ["0", "1"]
    assert all(str(r["job"]) == "7" and str(r["client_pid"]) == str(os.getpid())
               for r in attached)  # the clients ran in this process
    assert records[-1]["msg"].startswith("daemon stopped: 5 calls served")


def test_kv_and_json_keep_one_record_on_one_line():
    """A message with quotes, '=', backslashes and newlines, and a traceback: one line each in kv
    and json, and the fields come back exactly."""
    msg = 'say "hi"\\there\nrank=3 \ttab\x0cpage\u2028ls'
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("spina.test", logging.ERROR, __file__, 1, "%s", (msg,), exc_info)
    record.spina_fields = {"peer": "", "rank": 1, "call": 9, "pid": 5, "job": 2}
    kv = spina_log.Formatter("kv", "switch").format(record)
    js = spina_log.Formatter("json", "switch").format(record)
    assert len(kv.splitlines()) == 1 and len(js.splitlines()) == 1
    for r in (parse_logfmt(kv), json.loads(js)):
        assert r["msg"] == msg and r["proc"] == "switch" and r["level"] == "error"
        assert [str(r[k]) for k in ("job", "call", "rank", "peer", "pid_")] == \
            ["2", "9", "1", "", "5"] and str(r["pid"]) == str(os.getpid())
        assert r["exc"].startswith("Traceback") and r["exc"].endswith("ValueError: boom")
    assert 'peer=""' in kv
    assert 'msg="say \\"hi\\"\\\\there\\nrank=3 \\ttab\\u000cpage\\u2028ls"' in kv
    text = spina_log.Formatter("text", "switch").format(record)
    assert text.split("\n")[0].endswith(" ERROR spina.test: say \"hi\"\\there")
    # job first
    assert "rank=3 \ttab\x0cpage\u2028ls job=2 call=9 rank=1 peer=\"\" pid_=5\nTraceback" in text


def test_bound_fields_are_read_when_the_line_is_written(caplog):
    """bind(): fixed and callable fields on every line, per-line keywords on that line only;
    binding again adds fields; a plain logger takes extra=fields(...)."""
    state = {"call": 4}
    logger = logging.getLogger("spina.test.bind")
    alog = spina_log.bind(logger, job=3, call=lambda: state["call"])
    rlog = spina_log.bind(alog, rank=2)
    with caplog.at_level(logging.DEBUG, logger="spina.test.bind"):
        rlog.info("first")
        state["call"] = 5
        rlog.warning("second %d", 2, peer="x", exc_info=False)
        alog.info("third")
        logger.info("plain", extra=spina_log.fields(job=8))
    got = [(r.getMessage(), r.spina_fields) for r in caplog.records]
    assert got == [("first", {"job": 3, "call": 4, "rank": 2}),
                   ("second 2", {"job": 3, "call": 5, "rank": 2, "peer": "x"}),
                   ("third", {"job": 3, "call": 5}), ("plain", {"job": 8})]


def test_switch_drop_lines_name_the_packets_job_epoch_call_and_rank(caplog):
    """The software switch's per-packet debug lines (an unadmitted packet, a held newer
    round) carry the job, epoch, call and rank of the packet's header as fields."""
    from softswitch.pipeline import Pipeline
    from spina import wire
    from spina.config import JobConfig, WorkerAddr
    src = {r: (0, ("10.0.0.1", 5000 + r)) for r in range(2)}
    cfg = JobConfig(job=2, workers=tuple(WorkerAddr(r, *src[r][1]) for r in range(2)),
                    nslots=1, nlanes=1, block_size=4, epoch=3)
    p = Pipeline(pool_slots=4, slot_capacity=16)
    p.add_job(cfg, src)

    def packet(job: int, rnd: int, call: int) -> bytes:
        h = wire.Header(job=job, epoch=3, call=call, rank=0, slot=0, round=rnd, nlanes=1,
                        block_size=4, length=4)
        return wire.pack(h, [wire.END], None)

    with caplog.at_level(logging.DEBUG, logger="spina.softswitch"):
        assert p.process(packet(9, 0, 77), *src[0]) == []  # no job 9 here
        assert p.process(packet(2, 1, 78), *src[0]) == []  # round 1 starts: rank 1 to come
        assert p.process(packet(2, 2, 79), *src[0]) == []  # round 2 held: rank 1 not at 1
    got = [(r.getMessage(), r.spina_fields) for r in caplog.records
           if r.name == "spina.softswitch" and r.levelno == logging.DEBUG]
    assert got == [
        ("drop unadmitted from ('10.0.0.1', 5000): slot 0",
         {"job": 9, "epoch": 3, "call": 77, "rank": 0}),
        ("hold slot 0 round 2: 1 workers not yet at round 1",
         {"job": 2, "epoch": 3, "call": 79, "rank": 0})]
    assert p.job_counters(2)["job_held"] == 1


def test_verbosity_counts_down_from_the_base_level():
    """-v flags: each one level more, never past DEBUG."""
    assert [spina_log.verbosity(n) for n in range(4)] == ["WARNING", "INFO", "DEBUG", "DEBUG"]
    assert [spina_log.verbosity(n, "INFO") for n in range(3)] == ["INFO", "DEBUG", "DEBUG"]


ENTRY_POINTS = [
    ["-m", "host_agent.launch", "--nworkers", "2", "--job-file", "j.json"],
    ["-m", "host_agent", "launch", "--nworkers", "2", "--job-file", "j.json"],
    ["-m", "host_agent", "daemon"],
    ["-m", "spina_cli", "agent", "daemon"],
    ["-m", "ps", "shard", "--index", "0", "--nworkers", "1", "--size", "4"],
    ["-m", "ps", "coordinator", "--nworkers", "1"],
    ["-m", "spina_cli", "doctor"],
    ["-m", "spina_cli", "status", "--watch", "1"],
    ["-m", "softswitch", "udp"],
    ["-m", "softswitch", "l2", "-i", "1@lo"],
    ["-m", "spina_cli", "switch", "udp"],
    ["-m", "spina_cli", "deploy"],
    ["-m", "spina_cli", "status"],
]


@pytest.mark.parametrize("fmt", ["json", "kv"])
def test_switch_and_controller_processes_write_the_format(tmp_path, fmt):
    """`spina switch udp --grpc` and `spina deploy` with --log-format FMT: every line parses,
    proc names the process; the pipeline the deploy pushed shows on the switch's side."""
    sw = subprocess.Popen([sys.executable, "-m", "spina_cli", "switch", "udp", "--port", "0",
                           "--grpc", "127.0.0.1:0", "--log-format", fmt],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                          cwd=ROOT)
    try:
        port = grpc = None
        while port is None or grpc is None:
            line = sw.stdout.readline()
            assert line, sw.stderr.read()
            if line.startswith("listening "):
                port = int(line.split()[1].rpartition(":")[2])
            elif line.startswith("p4runtime "):
                grpc = line.split()[1]
        (tmp_path / "spina.yaml").write_text(json.dumps({
            "switches": [{"name": "s1", "target": "softswitch", "grpc": grpc,
                          "address": "127.0.0.1", "udp_port": port}],
            "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "switch_port": 0,
                         "udp_port": 41000 + i} for i in range(2)],
            "jobs": [{"id": 3, "members": ["w0", "w1"], "nslots": 2, "slot_base": 0}],
            "agents_dir": str(tmp_path / "agents")}))
        ctl = subprocess.run([sys.executable, "-m", "spina_cli", "deploy", "-c", "spina.yaml",
                              "--log-format", fmt, "--log-level", "INFO"], capture_output=True,
                             text=True, timeout=120, env=ENV, cwd=tmp_path)
        assert ctl.returncode == 0, ctl.stderr
    finally:
        sw.send_signal(signal.SIGTERM)
        sw.wait(timeout=20)
    check_common_fields(parse_lines(ctl.stderr, fmt), "controller")
    switch = parse_lines(sw.stderr.read(), fmt)
    check_common_fields(switch, "switch")
    assert any(r["msg"].startswith("pipeline committed") for r in switch)  # deploy pushed it


@pytest.mark.parametrize("argv", ENTRY_POINTS, ids=lambda a: " ".join(a[1:3]))
@pytest.mark.parametrize("option,value", [("--log-format", "xml"), ("--log-level", "LOUD")])
def test_a_bad_log_option_is_one_line_and_exit_2(tmp_path, argv, option, value):
    """Every entry point listed: a bad --log-format or --log-level is one `PROG: error:` line
    naming the option, exit 2, before anything starts."""
    out = subprocess.run([sys.executable, *argv, option, value], capture_output=True, text=True,
                         timeout=60, env=ENV, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and ": error: argument " + option in lines[0], out.stderr
    assert repr(value) in lines[0]


def test_daemon_config_log_format_is_checked(tmp_path):
    """The daemon's config field log_format: a bad value is one line naming the field, exit 2."""
    (tmp_path / "d.json").write_text(json.dumps({"log_format": "xml"}))
    out = subprocess.run([sys.executable, "-m", "host_agent", "daemon", "--config", "d.json"],
                         capture_output=True, text=True, timeout=60, env=ENV, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "field 'log_format': 'xml' is not one of text, kv, json" in out.stderr
