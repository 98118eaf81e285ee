"""A deployment as a user runs one, for tests: switch processes (or in-process switches) and
the controller that owns their runs, started from a desired state (imported by tests).

Modes: `inprocess` (UDP-mode software switches in the test's process, a Controller there
owning the runs), `plan` (`python -m softswitch udp --plan FILE --switch NAME` per switch),
`grpc` (`python -m softswitch udp --grpc`), `l2` (`python -m softswitch l2 -i ... --grpc`),
`bmv2` (`simple_switch_grpc --no-p4`, the program pushed by deploy), `mininet` (a testbed's
nodes, started by the testbed); every mode but `inprocess` runs `python -m controller serve`.
Every process started here is stopped by `stop`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from controller.controller import Controller
from controller.p4rt import Connection, P4RuntimeError, wait_listening
from controller.state import load
from softswitch.udp import UdpSwitch
from spina.procs import stop_process
from tests.waits import file_appears, until

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def jobs_of(doc: dict) -> dict[int, int]:
    """{job id: ranks} of a shape's jobs."""
    out = {j["id"]: len(j["members"]) for j in doc.get("jobs", [])}
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
        def line():
            got = [x for x in self.lines[name] if x.startswith(prefix)]
            p = self.procs[name]
            assert got or p.poll() is None, f"{name} exited {p.returncode}: {self.lines[name]}"
            return got[-1] if got else None
        return until(line, f"{name}'s line {prefix!r}", timeout)

    def kill(self, name: str) -> None:
        p = self.procs.pop(name)
        p.kill()
        p.wait()

    def tail(self, lines: int = 15) -> str:
        """The last `lines` lines each process printed, and how it ended if it did."""
        out = []
        for name, p in self.procs.items():
            how = "running" if p.poll() is None else f"exited {p.returncode}"
            out.append(f"--- {name} ({how}):")
            out.extend(self.lines[name][-lines:])
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs.values():
            stop_process(p, 10)
        self.procs.clear()


class Deployment:
    """The shape's switches and the controller that owns its runs, in one of the modes."""

    def __init__(self, mode: str, doc: dict, tmp: Path,
                 l2_interfaces: dict[str, list[str]] | None = None, nodes: dict | None = None):
        self.mode, self.doc = mode, doc
        # modes "l2" and "bmv2": {switch: its interfaces}, the switch's port p on [p - 1]
        self.l2_interfaces = l2_interfaces or {}
        self.nodes = nodes or {}  # mode "mininet": {switch: its started testbed node}
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
                    file_appears(self.agent_file(job, r))

    def start_switch(self, name: str) -> None:
        sw = self.state.switches[name]
        if self.mode == "mininet":  # the testbed started it (and restarts it)
            return
        if self.mode == "inprocess":
            self.switches[name] = UdpSwitch(sw.address, sw.udp_port).start()
            return
        if self.mode == "plan":
            self.procs.start(name, "-m", "softswitch", "udp", "--plan", str(self.cfg),
                             "--switch", name)
            self.procs.wait_line(name, "p4runtime ")
        elif self.mode == "l2":
            self.procs.start(name, "-m", "softswitch", "l2", *self._ports(name), "--grpc",
                             sw.grpc)
            self.procs.wait_line(name, "p4runtime ")
        elif self.mode == "bmv2":  # started empty, as BMv2 starts: deploy pushes the program
            self.procs.start(name, "--device-id", str(sw.device_id), "--no-p4", "--thrift-port",
                             str(sw.thrift_port), *self._ports(name), "--", "--grpc-server-addr",
                             sw.grpc, "--priority-queues", "8", program="simple_switch_grpc")
            try:
                wait_listening(sw.grpc)  # its gRPC server listening
            except P4RuntimeError as e:
                raise AssertionError(f"{e}: {self.procs.lines[name]}") from None
        else:
            self.procs.start(name, "-m", "softswitch", "udp", "--host", sw.address, "--port",
                             str(sw.udp_port), "--grpc", sw.grpc)
            self.procs.wait_line(name, "p4runtime ")

    def _ports(self, name: str) -> list[str]:
        """-i arguments: switch `name`'s port p on l2_interfaces[name][p - 1]."""
        return [a for p, ifname in enumerate(self.l2_interfaces[name], 1)
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
        elif self.mode == "mininet":
            self.nodes[name].restart()
        else:
            self.procs.kill(name)
            self.start_switch(name)

    def processes_tail(self) -> str:
        """What the deployment's processes printed last (for a failing test's message)."""
        return self.procs.tail() or f"(mode {self.mode}: no processes of its own)"

    def agent_file(self, job: int, rank: int) -> Path:
        return self.cfg.parent / "agents" / f"job{job}-rank{rank}.json"

    def stop(self) -> None:
        if self.runs is not None:
            self.runs.stop()
        if self.ctl is not None:
            self.ctl.close()
        self.procs.stop()
        for sw in self.switches.values():
            sw.stop()
