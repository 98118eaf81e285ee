"""Mininet, and the switch node classes that run SpINA in it.

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
        import mininet.net  # noqa: F401
    except ImportError:
        if not os.path.isdir(os.path.join(DEBIAN_SITE, "mininet")):
            raise ImportError("mininet is not installed (Debian: apt-get install mininet)")
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
        (softswitch.l2.configure format), set by the topology builder before start."""

        def __init__(self, name, **params):
            params["inNamespace"] = False  # a process in the root namespace, like BMv2
            super().__init__(name, **params)
            self.spina_config: dict = {}
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
            cfg = self.workdir / "switch.json"
            cfg.write_text(json.dumps(self.spina_config))
            log = open(self.workdir / "switch.log", "w")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "softswitch", "l2",
                 *self.port_args(), "--config", str(cfg)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            log.close()  # the child holds its own descriptor
            self.wait_ready("switching")

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
        """simple_switch_grpc with the compiled program (`make p4`), tables written through
        simple_switch_CLI (Thrift) from the same config. Each needs its own Thrift port."""
        next_thrift_port = 9090

        def start(self, controllers):
            js = ROOT / "p4src" / "build" / "spina_v1model.json"
            if not js.exists() or shutil.which("simple_switch_grpc") is None:
                raise RuntimeError("Bmv2Switch needs `make p4` output and simple_switch_grpc")
            self.prepare_intfs()
            self.thrift_port = Bmv2Switch.next_thrift_port
            Bmv2Switch.next_thrift_port += 1
            log = open(self.workdir / "switch.log", "w")
            self.proc = subprocess.Popen(
                ["simple_switch_grpc", "--device-id", str(self.thrift_port - 9000),
                 "--thrift-port", str(self.thrift_port), *self.port_args(), str(js), "--",
                 "--grpc-server-addr", f"127.0.0.1:{50000 + self.thrift_port}",
                 "--priority-queues", "8"], stdout=log, stderr=subprocess.STDOUT)
            log.close()
            import time
            for _ in range(50):
                if subprocess.run(["simple_switch_CLI", "--thrift-port", str(self.thrift_port)],
                                  input="\n", capture_output=True, text=True).returncode == 0:
                    break
                time.sleep(0.1)
            cmds = "\n".join(cli_commands(self.spina_config)) + "\n"
            subprocess.run(["simple_switch_CLI", "--thrift-port", str(self.thrift_port)],
                           input=cmds, capture_output=True, text=True, check=True)

    return SoftSwitch, Bmv2Switch


def cli_commands(cfg: dict) -> list[str]:
    """simple_switch_CLI commands that write a softswitch.l2.configure config into BMv2."""
    from spina.config import JobConfig
    from spina import wire
    out = [f"table_add ina_endpoint accept_ina {ep} =>" for ep in cfg.get("endpoints", ())]
    out += [f"table_add l2 bridge {e['mac']} => {e['port']}" for e in cfg.get("l2", ())]
    out += [f"table_add ipv4_routes route {r['prefix']} => {r['port']} {r['src_mac']} "
            f"{r['dst_mac']}" for r in cfg.get("routes", ())]
    if "qdepth_threshold" in cfg:
        out.append(f"table_set_default congestion set_qdepth_threshold {cfg['qdepth_threshold']}")
    handle = 0
    for jd in cfg.get("jobs", ()):
        jd = dict(jd)
        grp = int(jd.pop("mcast_grp", jd.get("job", 0) + 1))
        job = JobConfig.from_dict(jd)
        out.append(f"mc_mgrp_create {grp}")
        for w, wd in zip(job.workers, jd["workers"]):
            rid = job.job * wire.MAX_WORKERS + w.rank + 1
            out.append(f"table_add admission admit {wd['switch_port']} {w.host} {w.port} "
                       f"{job.job} {w.rank} => {job.epoch} {job.slot_base} {job.nslots} "
                       f"{job.nworkers} {job.block_size} {job.nlanes} {grp}")
            out.append(f"table_add worker_rewrite rewrite_for_worker {rid} => {wd['mac']} "
                       f"{w.host} {w.port}")
            out.append(f"mc_node_create {rid} {wd['switch_port']}")
            out.append(f"mc_node_associate {grp} {handle}")
            handle += 1
    return out
