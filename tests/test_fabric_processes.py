"""Two-level aggregation with every switch its own process: `python -m softswitch udp --plan
FILE --switch NAME` takes the switch's address, P4Runtime address and role (leaf or spine) from
the fabric plan (controller/plan.py, docs/scale_out.md). Runs through `controller serve` on
such switches: tests/test_seams.py.

Run just these tests:  .venv/bin/python -m pytest tests/test_fabric_processes.py
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import numpy as np
import yaml

from bench.scale_out import fabric_doc, tensors
from controller import plan
from host_agent.agent import Agent
from spina.net import bound_udp_socket, free_ports
from spina.procs import stop_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(plan_file, name: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "softswitch", "udp", "--plan", str(plan_file),
                             "--switch", name], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT})
    line = proc.stdout.readline()
    assert line.startswith("listening "), f"switch {name} did not start: {line!r}"
    assert proc.stdout.readline().startswith("p4runtime 127.0.0.1:")
    return proc, line.split()


def test_leaf_and_spine_processes_from_the_plan(tmp_path):
    """2 racks of 2 workers, 2 leaf processes and 1 spine process started from one plan file:
    each prints its role; int32 sums exact and float results bit-identical on every rank."""
    socks = [bound_udp_socket() for _ in range(4)]
    doc = fabric_doc(racks=2, per_rack=2, spines=1, nslots=4, block_size=256, nlanes=8,
                     switch_ports=free_ports(2), grpc_ports=free_ports(3),
                     worker_ports=[s.getsockname()[1] for s in socks])
    plan_file = tmp_path / "fabric.yaml"
    plan_file.write_text(yaml.safe_dump(doc))
    fabric = plan.load(plan_file)
    procs, agents = [], []
    try:
        for name in ("spine0", "leaf0", "leaf1"):  # spines first: no partial finds no job
            proc, words = _start(plan_file, name)
            procs.append(proc)
            host, port = fabric.switch_address(name)
            assert words[1:] == [f"{host}:{port}", "as", fabric.levels[name], name]
        job = fabric.job_config(fabric.jobs[7])
        agents = [Agent(job, r, fabric.agent_switch(f"w{r}"), sock=socks[r], timeout=30)
                  for r in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for density, integer in ((0.05, True), (1.0, True), (0.05, False)):
                ts = tensors(density, 3, n=1 << 15, nranks=4, integer=integer)
                got = list(pool.map(lambda a, t: a.allreduce(t), agents, ts))
                if integer:
                    want = np.sum(ts, axis=0, dtype=np.int32)
                    assert all(np.array_equal(g, want) for g in got)
                else:
                    assert all(g.tobytes() == got[0].tobytes() for g in got)
                    exact = np.sum(ts, axis=0, dtype=np.float64)
                    assert np.abs(got[0] - exact).max() < 1e-4 * max(1.0, np.abs(exact).max())
    finally:
        for a in agents:
            a.close()
        for p in procs:
            assert stop_process(p) == 0, "a switch process did not exit cleanly on SIGTERM"


def test_plan_switch_errors_are_one_line(tmp_path):
    """A switch name the plan lacks, a missing plan file, --plan without --switch: exit 2 and
    one line naming the option."""
    plan_file = tmp_path / "fabric.yaml"
    plan_file.write_text(yaml.safe_dump(fabric_doc(racks=2, per_rack=2, spines=1)))
    for args, words in (
            (["--plan", str(plan_file), "--switch", "nope"],
             "argument --switch: 'nope' is not a switch of"),
            (["--plan", str(tmp_path / "none.yaml"), "--switch", "leaf0"],
             "argument --plan: "),
            (["--plan", str(plan_file)], "argument --plan/--switch: give both")):
        r = subprocess.run([sys.executable, "-m", "softswitch", "udp", *args], cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
        assert r.returncode == 2, r.stderr
        assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_plan_switch_needs_a_p4runtime_address(tmp_path):
    """A --plan switch serves P4Runtime (where `controller serve` starts each run): a plan whose
    switch has none is refused in one line naming the field, exit 2."""
    plan_file = tmp_path / "fabric.yaml"
    plan_file.write_text(yaml.safe_dump(fabric_doc(racks=2, per_rack=1, spines=1,
                                                   switch_ports=free_ports(2))))
    out = subprocess.run([sys.executable, "-m", "softswitch", "udp", "--plan", str(plan_file),
                          "--switch", "leaf0"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "switches.leaf0.grpc: 'in-process'" in out.stderr, out.stderr
