"""The `spina` command (spina_cli/): dispatch, --help everywhere, `status --watch`, `doctor`.

Run just this file: .venv/bin/python -m pytest tests/test_cli.py
"""
import io
import json
import os
import subprocess
import sys

import pytest
import yaml

from spina.net import bound_udp_socket, free_port
from spina_cli import doctor, status
from spina_cli.main import COMMANDS, main
from tests.waits import until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_spina_help_lists_every_command_and_each_explains_itself(capsys):
    """`spina --help` lists every command; each command's --help exits 0 with its own text."""
    out = subprocess.run([sys.executable, "-m", "spina_cli", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0
    for name in COMMANDS:
        assert f"\n  {name} " in out.stdout
    for argv, words in ((["switch", "udp", "--help"], "--metrics"),
                        (["deploy", "--help"], "Push the pipeline"),
                        (["status", "--help"], "status"),
                        (["status", "--watch", "1", "--help"], "redraw"),
                        (["agent", "daemon", "--help"], "--metrics"),
                        (["capture", "--help"], "capture"), (["doctor", "--help"], "MTU"),
                        (["demo", "--help"], "usage")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        assert words in capsys.readouterr().out, argv
    assert main(["agent", "--help"]) == 0 and "daemon" in capsys.readouterr().out
    assert main(["nonsense"]) == 2 and "unknown command" in capsys.readouterr().err


def test_controller_options_may_come_before_or_after_the_command(tmp_path, monkeypatch):
    """`spina deploy -c F --election-id=3` and `python -m controller -c F deploy` parse alike,
    and an option given before the command is not reset by the command's copy of it."""
    from controller.__main__ import GLOBAL_DEFAULTS, _parser
    monkeypatch.chdir(tmp_path)  # -c names a file that exists (its type checks)
    for name in ("f.yaml", "x"):
        (tmp_path / name).write_text("")
    ap = _parser("spina")
    after = ap.parse_args(["deploy", "-c", "f.yaml", "--watch", "2", "--election-id=3"])
    before = ap.parse_args(["-c", "f.yaml", "--election-id=3", "deploy", "--watch", "2"])
    assert (after.config, after.election_id, after.watch) == ("f.yaml", 3, 2.0)
    assert vars(after) == vars(before)
    job = ap.parse_args(["job", "add", "--id", "2", "-v", "--config", "x", "--members", "a",
                         "--nslots", "4"])
    assert (job.config, job.verbose, job.id) == ("x", 1, 2)
    assert not hasattr(ap.parse_args(["status"]), "config")  # main() fills GLOBAL_DEFAULTS in
    assert GLOBAL_DEFAULTS["config"] == "spina.yaml"


@pytest.mark.parametrize("cmd", ["deploy", "serve", "status", "reset", "job"])
def test_every_command_help_lists_the_options_it_takes(cmd, capsys):
    """Each `spina CMD --help` names itself as `spina CMD` and lists -c, --metrics and the
    log options (and status its --watch)."""
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: spina {cmd} ")
    for opt in ("-c FILE", "--config FILE", "--metrics", "--election-id", "--timeout",
                "--log-level", "--log-format", "-v, --verbose"):
        assert opt in out, (cmd, opt)
    if cmd == "status":
        assert "--watch SECONDS" in out and "--count N" in out


def test_version(capsys):
    """`spina --version` prints the installed version."""
    from importlib.metadata import version
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"spina {version('spina')}\n"


@pytest.fixture
def deployed(tmp_path):
    """(config path, switch) of a software switch with its P4Runtime server and job 4 deployed."""
    from controller.controller import Controller
    from controller.state import load
    from softswitch.p4runtime_server import P4RuntimeServer
    from softswitch.udp import UdpSwitch
    sw = UdpSwitch("127.0.0.1", 0).start()
    srv = P4RuntimeServer(sw.dataplane, "127.0.0.1:0", servicer=sw.servicer()).start()
    socks = [bound_udp_socket() for _ in range(2)]
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump({
        "switches": [{"name": "s1", "target": "softswitch", "grpc": srv.address,
                      "address": "127.0.0.1", "udp_port": sw.address[1]}],
        "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "switch_port": 0,
                     "udp_port": s.getsockname()[1]} for i, s in enumerate(socks)],
        "jobs": [{"id": 4, "members": ["w0", "w1"], "nslots": 4, "slot_base": 0,
                  "block_size": 32, "nlanes": 4}],
        "agents_dir": "agents", "rendezvous": f"127.0.0.1:{free_port()}"}))
    for s in socks:
        s.close()
    with Controller(load(cfg), 1, timeout=20) as ctl:
        ctl.deploy()
    try:
        yield cfg, sw
    finally:
        srv.stop()
        sw.stop()


def _allreduce(cfg, election: int = 1):
    """One call of job 4's two ranks, in a run a controller of election id `election` starts
    (its run rendezvous, as `serve`)."""
    import concurrent.futures

    import numpy as np

    from controller.controller import Controller
    from controller.state import load
    from host_agent import assignment
    agents = [assignment.connect(cfg.parent / "agents" / f"job4-rank{r}.json", timeout=20)
              for r in range(2)]
    with Controller(load(cfg), election) as ctl, ctl.runs():
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda a: a.allreduce(np.arange(2000, dtype=np.int32)), agents))
    sent = sum(a.last_stats.packets_sent for a in agents)
    for a in agents:
        a.close()
    return sent


def test_read_only_tools_never_contest_a_running_controller(deployed):
    """While a controller holds primary (as `serve`), `controller status`, `spina status
    --watch` and `spina doctor` (several at once) read without an election id: each succeeds,
    the controller stays primary and its next run starts (before: "election id 1 is in use",
    or a watcher with a higher id took primary and every join failed)."""
    from controller.controller import Controller
    from controller.state import load
    cfg, _ = deployed
    env = dict(os.environ, PYTHONPATH=ROOT)
    with Controller(load(cfg), 1) as serving, serving.runs():
        serving.deploy()
        procs = [subprocess.Popen([sys.executable, "-m", *args, "-c", str(cfg), *tail],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for args, tail in ((["controller"], ["status"]), (["controller"], ["status"]),
                                    (["spina_cli", "status"], ["--watch", "0.1", "--count", "2"]),
                                    (["spina_cli", "doctor"], []))]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (p.args, out, err)
        conn = serving.session("s1").conn
        conn.refresh_arbitration()
        assert conn.is_primary and conn.primary_election == 1
        serving.deploy()  # still writes: nothing refused
    assert _allreduce(cfg) > 0


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_status_watch_redraws_on_a_terminal_and_prints_lines_otherwise(deployed):
    """Not a terminal: one key=value line per job and poll with the live counters; a
    terminal: the screen is cleared and the table redrawn each poll, with rates."""
    cfg, sw = deployed
    sent = _allreduce(cfg)
    out = io.StringIO()
    assert status.watch(str(cfg), 0.05, count=2, out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    for line in lines:
        kv = dict(x.split("=", 1) for x in line.split())
        assert kv["job"] == "4" and kv["switch"] == "s1" and int(kv["job_received"]) == sent
    assert "\x1b" not in out.getvalue()
    tty = _Terminal()
    status.watch(str(cfg), 0.05, count=2, out=tty)
    screens = tty.getvalue().split("spina status")[1:]
    assert len(screens) == 2
    assert "recv/s" not in screens[0] and "recv/s" in screens[1]
    assert tty.getvalue().count("\x1b[") >= 2  # cleared before each redraw
    header, _, row = screens[1].split("\n\n")[1].splitlines()[:3]
    got = dict(zip(header.split(), row.split()))
    assert got["job"] == "4" and got["switch"] == "s1" and got["recv"] == str(sent)
    body = screens[1].split("\n\n", 1)[1]  # below the title line (which names the file)
    assert all(len(line) <= 100 for line in body.splitlines()), body


def test_status_watch_on_a_real_terminal_shows_the_live_table(deployed):
    """`spina status --watch` in a 100 x 30 tmux pane (capture-pane): the title, the table's
    header and job 4's row with the counters the switch holds, the legend, nothing past 100
    columns and no escape sequence left on screen."""
    import shlex
    import shutil
    if shutil.which("tmux") is None:
        pytest.skip("tmux not installed (scripts/setup.sh installs it)")
    cfg, sw = deployed
    sent = _allreduce(cfg)
    sock = f"spina-test-{os.getpid()}"
    cmd = (f"PYTHONPATH={shlex.quote(ROOT)} {shlex.quote(sys.executable)} -m spina_cli status "
           f"-c {shlex.quote(str(cfg))} --watch 0.2")
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-s", "watch", "-x", "100", "-y", "30", cmd],
                   check=True, cwd=ROOT)
    try:
        def screen():  # the second screen: rates known
            got = subprocess.run([*tmux, "capture-pane", "-p", "-t", "watch"],
                                 capture_output=True, text=True, check=True).stdout
            return got if "recv/s" in got else None
        screen = until(screen, "the watch's second screen (recv/s)", 60, every=0.2)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    lines = screen.splitlines()
    assert lines[0].startswith("spina status") and str(cfg) in lines[0]
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["job", "switch"])
    got = dict(zip(lines[header].split(), lines[header + 2].split()))
    assert (got["job"], got["switch"], got["recv"]) == ("4", "s1", str(sent))
    assert int(got["recv"]) == sw.pipeline.job_counters(4)["job_received"]
    assert any(line.startswith("recv job_received") for line in lines)
    assert all(len(line) <= 100 for line in lines) and "\x1b" not in screen


def test_the_watch_table_fits_100_columns_at_its_largest():
    """Counters of 10 digits, a 4-digit job id, a 14-character switch name, a spine level and
    both rates: every line of the table and its legend within 100 columns."""
    from spina.spec import JOB_COUNTERS
    row = {"job": 2046, "switch": "leaf0-rack1234", "level": "spine", "slots": "240..255",
           "workers": 32, "installed": "yes", **{c: 9_999_999_999 for c in JOB_COUNTERS},
           "job_received/s": "1234567", "job_results/s": "123456"}
    from controller.controller import format_table
    lines = format_table(status.screen_rows([row])).splitlines() + status.LEGEND.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[2].split() == ["2046", "leaf0-rack1234", "spine", "yes", "10G", "1.23M",
                                "10G", "123k", "10G", "10G", "10G", "10G"]
    assert [status.compact(v) for v in (99_999, 100_000, 999_999, 1_234_567)] == \
        ["99999", "100k", "1M", "1.23M"]


def _doctor(cfg, capsys) -> tuple[int, list[str]]:
    """(exit status, output lines) of `spina doctor -c cfg`."""
    rc = doctor.main(["-c", str(cfg)])
    return rc, capsys.readouterr().out.splitlines()


def test_doctor_passes_a_good_deployment_and_names_what_is_wrong(deployed, capsys):
    """doctor beside `serve`'s rendezvous: every check ok on a deployed job (exit 0), the data
    port counting its probe; then a round rank 1 never joined is a warning naming the slot
    and rank, an agent file that differs from the switch and a job the switch does not admit
    fail naming them, and with the rendezvous stopped that fails too (exit 1)."""
    from controller.controller import Controller
    from controller.state import load
    from spina import wire
    cfg, sw = deployed
    doc = yaml.safe_load(cfg.read_text())
    with Controller(load(cfg), 1) as ctl, ctl.runs():
        rc, lines = _doctor(cfg, capsys)
        assert rc == 0, lines
        port = f"127.0.0.1:{sw.address[1]}"
        rdv = doc["rendezvous"]
        assert [x for x in lines if x.split()[1] in ("switch", "job", "rendezvous")] == [
            f"ok   switch s1: answers P4Runtime at {doc['switches'][0]['grpc']}",
            "ok   switch s1: pipeline matches the P4Info",
            f"ok   switch s1: data port {port} counts a probe (port_unadmitted +1)",
            "ok   job 4: admitted on s1, slots and epoch 1 agree",
            f"ok   job 4: agent files {cfg.parent / 'agents'}/job4-rank*.json match s1",
            "ok   job 4: 604-byte packets fit MTU 65536 (lo)",
            "ok   job 4: no round waits for a worker on s1 (4 slots)",
            f"ok   rendezvous {rdv}: serves this file's jobs [4] (controller pid {os.getpid()})"]
        assert sw.pipeline.counters["port_unadmitted"][0] == 1  # the probe, nothing else
        w0 = doc["workers"][0]
        s = bound_udp_socket(port=w0["udp_port"])  # rank 0 starts round 0 of slot 1 alone
        s.sendto(wire.pack(wire.Header(job=4, epoch=1, rank=0, slot=1, round=0, nlanes=4,
                                       block_size=32, length=128), [wire.END] * 4), sw.address)
        s.close()
        f = cfg.parent / "agents" / "job4-rank1.json"
        bad = json.loads(f.read_text())
        bad["job"]["nslots"] = 8
        f.write_text(json.dumps(bad))
        rc, lines = _doctor(cfg, capsys)
        assert rc == 1
        assert "warn job 4: 1 of its 4 slots on s1 wait for rank 1 (slot 1 at round 0 first), " \
               "unchanged for 1 s: a worker stopped mid-call? The job's next run clears " \
               "them" in lines, "\n".join(lines)
        assert f"FAIL worker w1: {f} says nslots 8, s1 has 4 (`spina deploy`)" in lines
    doc["workers"].append({"name": "w9", "ip": "127.0.0.1", "switch_port": 0, "udp_port": 9})
    doc["jobs"].append({"id": 5, "members": ["w9"], "nslots": 2, "slot_base": 4,
                        "block_size": 32, "nlanes": 4})
    cfg.write_text(yaml.safe_dump(doc))
    rc, lines = _doctor(cfg, capsys)
    assert rc == 1
    assert "FAIL job 5: not admitted on switch s1 (`spina deploy`)" in lines
    assert "ok   worker w9: 127.0.0.1 is an address of this host" in lines
    assert (f"FAIL rendezvous {rdv}: Connection refused: no `spina serve` answers there "
            "(agents stop at their first call)") in lines, "\n".join(lines)


def test_doctor_fails_a_data_port_that_counts_nothing(deployed, capsys):
    """A file whose switch UDP port is not the switch's: the probe to it is not counted and
    doctor fails naming the address (and the agent files naming the other one)."""
    cfg, sw = deployed
    doc = yaml.safe_load(cfg.read_text())
    wrong = free_port()
    doc["switches"][0]["udp_port"] = wrong
    cfg.write_text(yaml.safe_dump(doc))
    rc, lines = _doctor(cfg, capsys)
    assert rc == 1
    assert (f"FAIL switch s1: a probe to its data port 127.0.0.1:{wrong} was not counted "
            "within 1 s (not reachable from here, or not this switch's address and port)"
            in lines)
    rank0 = cfg.parent / "agents" / "job4-rank0.json"
    assert (f"FAIL worker w0: {rank0} says switch 127.0.0.1:{sw.address[1]}, s1 "
            f"listens on 127.0.0.1:{wrong} (`spina deploy`)") in lines


def test_doctor_epoch_comparison_wraps_with_the_16_bit_epoch():
    """Epochs cycle 1..65535: 1 is a run after 65535, 65535 a run before 1, half a cycle the
    border between newer and older."""
    assert doctor.EPOCH_CYCLE == 65535
    assert doctor.epoch_runs_after(1, 65535) == 1
    assert doctor.epoch_runs_after(65535, 1) == 65534
    assert doctor.epoch_runs_after(7, 7) == 0
    assert doctor.epoch_runs_after(3, 65000) == 538
    assert doctor.epoch_runs_after(32768, 1) == doctor.EPOCH_CYCLE // 2  # newest still newer


def _start_switch_process():
    """A `python -m softswitch udp --grpc` subprocess on free ports: (process, udp port, grpc)."""
    proc = subprocess.Popen([sys.executable, "-m", "softswitch", "udp", "--port", "0",
                             "--grpc", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    port = grpc = None
    while port is None or grpc is None:
        line = proc.stdout.readline()
        assert line, "the switch exited before it listened"
        if line.startswith("listening "):
            port = int(line.split()[1].rpartition(":")[2])
        elif line.startswith("p4runtime "):
            grpc = line.split()[1]
    return proc, port, grpc


@pytest.mark.parametrize("hosts", [1], indirect=True)
def test_doctor_probes_workers_and_clocks_through_a_real_switch_process(hosts, tmp_path):
    """Against a real switch process: a local worker is ok; a worker in a namespace answers ICMP
    and its clock (the same kernel clock) is within 1 ms; a worker address nobody holds fails,
    named; a worker whose admission entry differs from the file fails, named."""
    from controller.controller import Controller
    from controller.state import load
    ns, sw_if = hosts[0]
    net = f"10.213.{os.getpid() % 250}"  # a subnet of this test's own on its veth
    subprocess.run(["ip", "-n", ns, "addr", "add", f"{net}.1/24", "dev", "eth0"], check=True)
    subprocess.run(["ip", "addr", "add", f"{net}.2/24", "dev", sw_if], check=True)
    proc, port, grpc = _start_switch_process()
    try:
        cfg = tmp_path / "spina.yaml"
        doc = {"switches": [{"name": "s1", "target": "softswitch", "grpc": grpc,
                             "address": "127.0.0.1", "udp_port": port}],
               "workers": [{"name": "w0", "ip": "127.0.0.1", "switch_port": 0, "udp_port": 41000},
                           {"name": "w1", "ip": f"{net}.1", "switch_port": 0, "udp_port": 41001},
                           {"name": "w2", "ip": f"{net}.99", "switch_port": 0, "udp_port": 41002}],
               "jobs": [{"id": 4, "members": ["w0", "w1", "w2"], "nslots": 4, "slot_base": 0,
                         "block_size": 32, "nlanes": 4}],
               "agents_dir": str(tmp_path / "agents"),
               # a rendezvous port of its own, where nothing answers: not the default 47100,
               # which another deployment on this host may serve (issue 44 item 6)
               "rendezvous": f"127.0.0.1:{free_port()}"}
        cfg.write_text(yaml.safe_dump(doc))
        with Controller(load(cfg), 1, timeout=20) as ctl:
            ctl.deploy()
        doc["workers"][0]["udp_port"] = 41009  # the switch still admits w0 from 41000
        cfg.write_text(yaml.safe_dump(doc))
        out = subprocess.run([sys.executable, "-m", "spina_cli", "doctor", "-c", str(cfg),
                              "--probe-timeout", "0.5"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    lines = out.stdout.splitlines()
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"ok   switch s1: answers P4Runtime at {grpc}" in lines
    assert "ok   job 4: admitted on s1, slots and epoch 1 agree" in lines
    assert ("FAIL worker w0: switch s1 does not admit job 4 rank 0 from 127.0.0.1:41009 "
            "(port 0); `spina deploy`") in lines
    assert f"ok   worker w1: admitted on s1 as job 4 rank 1 from {net}.1:41001 (port 0)" in lines
    assert "ok   worker w0: 127.0.0.1 is an address of this host" in lines
    assert any(x.startswith(f"ok   worker w1: {net}.1 answers ICMP timestamp (") for x in lines)
    assert (f"FAIL worker w2: {net}.99 does not answer ICMP from here (no reply in 0.5 s)"
            in lines)
    clock = [x for x in lines if x.startswith(f"ok   host {net}.1 (w1): clock ")]
    assert len(clock) == 1, out.stdout
    assert abs(int(clock[0].split("clock ")[1].split()[0])) <= 1  # one kernel, whole ms
    assert f"ok   switch s1: data port 127.0.0.1:{port} counts a probe (port_unadmitted +1)" \
        in lines
    assert any(x.startswith("FAIL rendezvous ") for x in lines)  # no `serve` here
    assert sum(x.startswith("FAIL") for x in lines) == 3
    assert any(x.startswith(("ok   this host: clock synchronized",
                             "warn this host: the kernel says the clock is not synchronized"))
               for x in lines)


def test_a_stopped_switch_is_one_line_naming_its_address(tmp_path):
    """spina status, deploy and doctor against a P4Runtime port nobody listens on (a stopped
    switch; --timeout 30): the refusal named with the address, not a 30 s wait: status and
    deploy exit 2 with one line, doctor's first line is the switch's FAIL and it exits 1."""
    grpc = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump({
        "switches": [{"name": "s1", "target": "softswitch", "grpc": grpc,
                      "address": "127.0.0.1", "udp_port": 47000}],
        "workers": [{"name": "w0", "ip": "127.0.0.1", "switch_port": 0, "udp_port": 41000}],
        "jobs": [{"id": 1, "members": ["w0"], "nslots": 2, "slot_base": 0}],
        "agents_dir": str(tmp_path / "agents")}))
    said = f"no P4Runtime server at {grpc}: Connection refused (is the switch running?)"
    env = {**os.environ, "PYTHONPATH": ROOT}
    for cmd in ("status", "deploy"):
        out = subprocess.run([sys.executable, "-m", "spina_cli", cmd, "-c", str(cfg),
                              "--timeout", "30"], capture_output=True, text=True, timeout=120,
                             cwd=ROOT, env=env)
        assert (out.returncode, out.stderr) == (2, f"spina {cmd}: error: {said}\n"), cmd
    out = subprocess.run([sys.executable, "-m", "spina_cli", "doctor", "-c", str(cfg),
                          "--timeout", "30"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env)
    assert out.returncode == 1
    assert out.stdout.splitlines()[0] == f"FAIL switch s1: {said}"


def test_clock_offset_from_icmp_timestamps():
    """The NTP-style offset: path delay cancels, the sign is theirs minus ours, midnight wraps."""
    assert doctor.clock_offset_ms(1000, 1205, 1206, 1011) == 200.0  # 5 ms each way, +200
    assert doctor.clock_offset_ms(1000, 800, 801, 1006) == -202.5
    day = doctor.DAY_MS
    assert doctor.clock_offset_ms(day - 2, 8, 9, 1) == 9.0  # across midnight: 10 ms ahead
    assert doctor.clock_offset_ms(3, day - 47, day - 46, 5) == -50.5


def test_doctor_reports_a_host_that_does_not_answer_by_worker_name(tmp_path):
    """check(): a worker address with a route but no host (TEST-NET-3 via the default route, or
    no route at all) fails with the worker named, after the switch's own failure."""
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump({
        "switches": [{"name": "s1", "target": "softswitch", "grpc": "127.0.0.1:1",
                      "address": "127.0.0.1", "udp_port": 47000}],
        "workers": [{"name": "far", "ip": "203.0.113.9", "switch_port": 0, "udp_port": 41000}],
        "jobs": [{"id": 1, "members": ["far"], "nslots": 2, "slot_base": 0}]}))
    lines = [f"{level} {msg}" for level, msg in doctor.check(str(cfg), timeout=1,
                                                              probe_timeout=0.3)]
    assert lines[0] == ("FAIL switch s1: no P4Runtime server at 127.0.0.1:1: Connection "
                        "refused (is the switch running?)")
    far = [x for x in lines if "worker far" in x]
    assert far in (["FAIL worker far: no route to 203.0.113.9"],
                   ["FAIL worker far: 203.0.113.9 does not answer ICMP from here "
                    "(no reply in 0.3 s)"]), lines


def test_doctor_names_another_deployments_rendezvous(tmp_path):
    """doctor's rendezvous check: a rendezvous on the file's address that serves other jobs
    (another deployment's serve) fails naming it; this file's own passes."""
    from controller.state import load
    from spina.rendezvous import RendezvousServer
    cfg = tmp_path / "spina.yaml"
    other = RendezvousServer("127.0.0.1", 0, {1: (4, 1)}, lambda j, e: None,
                             owner="controller", source="/srv/other/spina.yaml").start()
    rdv = "{}:{}".format(*other.address)
    try:
        cfg.write_text(yaml.safe_dump({
            "switches": [{"name": "s1", "target": "softswitch", "grpc": "127.0.0.1:1",
                          "address": "127.0.0.1", "udp_port": 9}],
            "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "switch_port": 0,
                         "udp_port": 10 + i} for i in range(2)],
            "jobs": [{"id": 4, "members": ["w0", "w1"], "nslots": 4, "slot_base": 0}],
            "agents_dir": "agents", "rendezvous": rdv}))
        state = load(cfg)
        assert doctor.rendezvous_check(state, 2) == ("FAIL", (
            f"rendezvous {rdv}: is the rendezvous of a controller (jobs [1], pid {os.getpid()}, "
            f"file /srv/other/spina.yaml), not this file's (jobs [4], {cfg.resolve()}): another "
            "deployment holds the address; agents would join its runs (give this file another "
            "`rendezvous`)"))
    finally:
        other.stop()
    from controller.controller import Controller
    with Controller(state) as ctl, ctl.runs():
        assert doctor.rendezvous_check(state, 2) == (
            "ok", f"rendezvous {rdv}: serves this file's jobs [4] (controller pid {os.getpid()})")
