"""The README's multi-process path, command for command, twice in a row (issue 26, defect 5):
a software switch with its P4Runtime server, `make serve` on controller/examples/softswitch.yaml,
then two programs of 4 rank processes (examples/one_rank.py): each gets its own sums.

The path uses the default ports (47000, 9559, 47100), so it runs in a network namespace of its
own: another SpINA deployment on the host's loopback cannot take them or be taken for it
(issue 44 item 6); the second case proves it with another deployment's rendezvous on the
host's 127.0.0.1:47100 beside it. Without root or iproute2 both skip, saying why.

Run just this test:  .venv/bin/python -m pytest tests/test_readme_path.py
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spina import netns
from spina.rendezvous import DEFAULT_ADDRESS, RendezvousServer
from tests.waits import until

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
AGENTS = ROOT / "build" / "agents"  # the example file's agents_dir


def _program(ns: str, value: float) -> list[str]:
    """The README's `for r in 0 1 2 3; do ... one_rank.py ... & done; wait $ranks`, in
    namespace `ns`: each rank's line."""
    procs = [subprocess.Popen(netns.command(ns, sys.executable, "examples/one_rank.py",
                                            AGENTS / f"job1-rank{r}.json", "--value", value),
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


@pytest.fixture
def own_namespace():
    """A network namespace of this test's own (loopback up): the default ports are its."""
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(f"the README path runs in a namespace of its own: {why}")
    with netns.Network() as net:
        yield net.namespace(netns.unique_tag("rdm"))


def test_readme_multi_process_path_twice(own_namespace, tmp_path):
    """Two programs in a row on one switch and one `serve`: 4.0 then 40.0 on every rank."""
    _readme_path(own_namespace, tmp_path)


def test_readme_path_beside_another_deployment_on_the_host(own_namespace, tmp_path):
    """Another deployment's rendezvous on the host's 127.0.0.1:47100 (jobs [1] of 2 workers:
    the README's job id, another size) changes nothing for the path in its namespace: 4.0,
    then 40.0. (If the host's 47100 is held already, that holder is the other deployment.)"""
    try:
        other = RendezvousServer(*DEFAULT_ADDRESS, {1: (2, 1)}, lambda j, e: None,
                                 owner="controller", source="/srv/another/spina.yaml").start()
    except OSError as e:
        assert e.errno == errno.EADDRINUSE, e
        other = None
    try:
        _readme_path(own_namespace, tmp_path)
        if other is not None:
            assert other.runs_started == 0 and not other.jobs[1].waiting
    finally:
        if other is not None:
            other.stop()


def _readme_path(ns: str, tmp_path: Path) -> None:
    switch = subprocess.Popen(netns.command(ns, sys.executable, "-m", "softswitch", "udp",
                                            "--grpc"), cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    serve = None
    log = tmp_path / "serve.log"
    try:
        assert switch.stdout.readline().startswith("listening 127.0.0.1:47000")
        assert switch.stdout.readline().startswith("p4runtime 127.0.0.1:9559")
        for f in AGENTS.glob("job1-rank*.json"):
            f.unlink()  # only files this serve writes count
        with open(log, "w") as out:
            serve = subprocess.Popen(netns.command(ns, "make", "serve", f"PY={sys.executable}"),
                                     cwd=ROOT,
                                     env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        def agent_files():
            assert serve.poll() is None, f"make serve exited {serve.returncode}: {log.read_text()}"
            return len(list(AGENTS.glob("job1-rank*.json"))) >= 4
        until(agent_files, "serve's 4 agent files", 60, every=0.1)
        assert _program(ns, 1) == [f"rank {r}: sum 4" for r in range(4)], log.read_text()
        assert _program(ns, 10) == [f"rank {r}: sum 40" for r in range(4)], log.read_text()
    finally:
        try:
            if serve is not None:
                _stop(serve, group=True)
        finally:
            _stop(switch)
