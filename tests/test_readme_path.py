"""The README's multi-process path, command for command, twice in a row (issue 26, defect 5):
a software switch with its P4Runtime server, `make serve` on controller/examples/softswitch.yaml,
then two programs of 4 rank processes (examples/one_rank.py): each gets its own sums.

Run just this test:  .venv/bin/python -m pytest tests/test_readme_path.py
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.waits import until

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
AGENTS = ROOT / "build" / "agents"  # the example file's agents_dir


def _program(value: float) -> list[str]:
    """The README's `for r in 0 1 2 3; do ... one_rank.py ... & done; wait $ranks`: each
    rank's line."""
    procs = [subprocess.Popen([sys.executable, "examples/one_rank.py",
                               str(AGENTS / f"job1-rank{r}.json"), "--value", str(value)],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(4)]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, e
        out.append(o.strip())
    return out


def _stop(p: subprocess.Popen, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after 20 s: a process this test started never outlives it (a
    `serve` left running once held port 9559's primary election through the BMv2 tests)."""
    if p.poll() is not None:
        return
    kill = (lambda s: os.killpg(p.pid, s)) if group else p.send_signal
    kill(signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        kill(signal.SIGKILL)
        p.wait(20)
        raise AssertionError(f"{p.args} ignored SIGTERM for 20 s") from None


def test_readme_multi_process_path_twice(tmp_path):
    """Two programs in a row on one switch and one `serve`: 4.0 then 40.0 on every rank."""
    switch = subprocess.Popen([sys.executable, "-m", "softswitch", "udp", "--grpc"], cwd=ROOT,
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    serve = None
    log = tmp_path / "serve.log"
    try:
        assert switch.stdout.readline().startswith("listening 127.0.0.1:47000")
        assert switch.stdout.readline().startswith("p4runtime 127.0.0.1:9559")
        for f in AGENTS.glob("job1-rank*.json"):
            f.unlink()  # only files this serve writes count
        with open(log, "w") as out:
            serve = subprocess.Popen(["make", "serve", f"PY={sys.executable}"], cwd=ROOT,
                                     env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        def agent_files():
            assert serve.poll() is None, f"make serve exited {serve.returncode}: {log.read_text()}"
            return len(list(AGENTS.glob("job1-rank*.json"))) >= 4
        until(agent_files, "serve's 4 agent files", 60, every=0.1)
        assert _program(1) == [f"rank {r}: sum 4" for r in range(4)], log.read_text()
        assert _program(10) == [f"rank {r}: sum 40" for r in range(4)], log.read_text()
    finally:
        try:
            if serve is not None:
                _stop(serve, group=True)
        finally:
            _stop(switch)
