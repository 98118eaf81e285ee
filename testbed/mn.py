"""Mininet, and the switch node classes that run SpINA in it.

A switch node gets its tables from the controller in one of two ways:
- from its L2 switch config (`spina_config`, the format of softswitch/README.md): the software
  switch programs itself with the controller's classes in process (`python -m softswitch l2
  --config`), and a BMv2 node is programmed over P4Runtime by `controller.Controller` on that
  one-switch state (registers through its Thrift adapter);
- or, with `serve_p4runtime` set before start, the node only serves P4Runtime over gRPC on
  loopback and the testbed's desired state (every switch of the network, with a `fabric:`
  section) is deployed to it by `controller.Controller(state).deploy()` (topos.py,
  two-level mode). `p4runtime_fields()` is what the desired state says about the node.

Debian's `mininet` package installs the module for the system Python only; `import_mininet`
finds it there when the running interpreter (a venv) has no `mininet` of its own, without
leaving Debian's site-packages on sys.path.
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from spina.procs import stop_process

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEBIAN_SITE = "/usr/lib/python3/dist-packages"


def import_mininet():
    """The mininet package (module objects: net, node, topo, link); ImportError if absent."""
    try:
        import mininet.net
    except ImportError:
        if not os.path.isdir(os.path.join(DEBIAN_SITE, "mininet")):
            raise ImportError(
                "mininet is not installed (Debian: apt-get install mininet)") from None
        sys.path.append(DEBIAN_SITE)
        try:
            for m in ("mininet.net", "mininet.node", "mininet.topo", "mininet.link",
                      "mininet.log"):
                importlib.import_module(m)
        finally:
            sys.path.remove(DEBIAN_SITE)
    if shutil.which("mnexec") is None:
        raise ImportError("mnexec not on PATH (Debian: apt-get install mininet)")
    import mininet
    return mininet


def switch_classes():
    """(SoftSwitch, Bmv2Switch) as mininet.node.Switch subclasses."""
    mininet = import_mininet()
    Switch = mininet.node.Switch

    class SpinaSwitch(Switch):
        """A switch process on this node's ports; `spina_config` is its table contents
        (controller.softswitch_files.from_l2_config format), set by the topology builder
        before start."""

        def __init__(self, name, **params):
            params["inNamespace"] = False  # a process in the root namespace, like BMv2
            super().__init__(name, **params)
            self.spina_config: dict = {}
            self.serve_p4runtime = False  # True: tables come from a Controller over gRPC
            self.grpc_addr: str | None = None  # where it serves P4Runtime, once started
            self.proc: subprocess.Popen | None = None
            self.workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"spina-{name}-"))

        def port_args(self) -> list[str]:
            out = []
            for intf in self.intfList():
                port = self.ports[intf]
                if intf.name != "lo" and port > 0:
                    out += ["-i", f"{port}@{intf.name}"]
            return out

        def prepare_intfs(self):
            for intf in self.intfList():
                if intf.name == "lo":
                    continue
                subprocess.run(["ethtool", "-K", intf.name, "tx", "off"], capture_output=True)
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{intf.name}.disable_ipv6=1"],
                               capture_output=True)

        def restart(self) -> None:
            """The switch process dies (its tables and registers lost) and starts again on
            the same ports and addresses: what a controller's `serve` reconciles."""
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
            self.start([])

        def stop(self, deleteIntfs=True):
            if self.proc is not None:
                stop_process(self.proc, 5)
                self.proc = None
            super().stop(deleteIntfs)
            shutil.rmtree(self.workdir, ignore_errors=True)

        def log_text(self) -> str:
            p = self.workdir / "switch.log"
            return p.read_text() if p.exists() else ""

    class SoftSwitch(SpinaSwitch):
        """The software switch in L2 mode (`python -m softswitch l2`)."""

        def start(self, controllers):
            self.prepare_intfs()
            if self.serve_p4runtime:  # port 0 at first: the switch picks a free one and
                # prints it; a restart keeps it, so a controller finds the switch again
                tables = ["--grpc", self.grpc_addr or "127.0.0.1:0"]
            else:
                cfg = self.workdir / "switch.json"
                cfg.write_text(json.dumps(self.spina_config))
                tables = ["--config", str(cfg)]
            log = open(self.workdir / "switch.log", "w")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "softswitch", "l2", *self.port_args(), *tables],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            log.close()  # the child holds its own descriptor
            if self.serve_p4runtime:
                self.wait_ready("p4runtime ")
                # the line is "p4runtime ADDR device ID"
                line = next(x for x in self.log_text().splitlines() if x.startswith("p4runtime "))
                self.grpc_addr = line.split()[1]
            else:
                self.wait_ready("switching")

        def p4runtime_fields(self) -> dict:
            """This node's fields in a desired state's `switches` entry."""
            return {"target": "softswitch", "grpc": self.grpc_addr, "device_id": 0}

        def wait_ready(self, marker: str, timeout: float = 20.0) -> None:
            """Until the switch process has printed `marker` (its sockets are open)."""
            import time
            deadline = time.monotonic() + timeout
            while marker not in self.log_text():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.log_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} not ready after {timeout:g} s")
                time.sleep(0.05)

    class Bmv2Switch(SpinaSwitch):
        """simple_switch_grpc with the compiled program (`make p4`), its tables written by the
        controller from the same config. Each needs its own Thrift and gRPC port."""
        next_thrift_port = 9090
        thrift_port: int | None = None  # this node's, from assign_addresses

        def assign_addresses(self) -> None:
            """This node's Thrift port, device id, gRPC address and program files (once: a
            restart keeps them)."""
            if self.thrift_port is not None:
                return
            build = ROOT / "p4src" / "build"
            self.device_config = str(build / "spina_v1model.json")
            self.p4info = str(build / "spina_v1model.p4info.txtpb")
            self.thrift_port = Bmv2Switch.next_thrift_port
            Bmv2Switch.next_thrift_port += 1
            self.device_id = self.thrift_port - 9000
            self.grpc_addr = f"127.0.0.1:{50000 + self.thrift_port}"

        def start(self, controllers):
            self.assign_addresses()
            if (not os.path.exists(self.device_config)
                    or shutil.which("simple_switch_grpc") is None):
                raise RuntimeError("Bmv2Switch needs `make p4` output and simple_switch_grpc")
            self.prepare_intfs()
            log = open(self.workdir / "switch.log", "w")
            self.proc = subprocess.Popen(
                ["simple_switch_grpc", "--device-id", str(self.device_id),
                 "--thrift-port", str(self.thrift_port), *self.port_args(), self.device_config,
                 "--", "--grpc-server-addr", self.grpc_addr, "--priority-queues", "8"],
                stdout=log, stderr=subprocess.STDOUT)
            log.close()
            from controller.p4rt import wait_listening
            wait_listening(self.grpc_addr)  # a Connection to a port not listening fails at once
            if self.serve_p4runtime:  # the testbed's Controller deploys
                return
            from controller.controller import Controller
            from controller.softswitch_files import from_l2_config
            state = from_l2_config(self.spina_config, name=self.name, **self.p4runtime_fields())
            with Controller(state, timeout=20.0) as c:
                c.deploy(agent_files=False)

        def p4runtime_fields(self) -> dict:
            """This node's fields in a desired state's `switches` entry (pipeline pushed by
            the controller, registers through simple_switch_CLI on its Thrift port)."""
            return {"target": "bmv2", "grpc": self.grpc_addr, "device_id": self.device_id,
                    "thrift_port": self.thrift_port, "p4info": self.p4info,
                    "device_config": self.device_config}
    return SoftSwitch, Bmv2Switch
