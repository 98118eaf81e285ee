"""The BMv2 target: simple_switch_grpc running p4src/v1model/spina_v1model.p4 on veth pairs.

Tables, default actions, multicast groups and counters go through the controller's P4Runtime
client (controller.p4rt.Connection, gRPC on a free loopback port); registers, counter resets and
queue rates through the controller's Thrift adapter (controller.registers.ThriftRegisters:
simple_switch_CLI on a free Thrift port), because BMv2's P4Runtime server answers UNIMPLEMENTED to
register reads and writes.

Needs root (veth pairs, raw sockets), `p4c-bm2-ss`, `simple_switch_grpc` and
`simple_switch_CLI` on PATH. `unavailable()` says why not, for the skip message.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import pathlib
import select
import shutil
import socket
import subprocess
import tempfile
import time

from bmv2_tests.target import PORTS, P4RuntimeTarget
from controller.p4rt import Connection, wait_listening
from controller.registers import ThriftRegisters
from spina import netns, spec
from spina.net import free_ports
from spina.procs import stop_process

ROOT = pathlib.Path(__file__).resolve().parents[1]
P4_TOP = ROOT / "p4src" / "v1model" / "spina_v1model.p4"
PORTS_FILE = ROOT / "bench" / "topologies" / "ports4.yaml"  # its ports' network
TOOLS = ("p4c-bm2-ss", "simple_switch_grpc", "simple_switch_CLI")
CROSS_PORT_GAP = 0.05  # s between frames sent on different ports (see Bmv2Target.send)


def unavailable() -> str | None:
    """Why the BMv2 target cannot run here, or None if it can."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"BMv2 target skipped: {', '.join(missing)} not on PATH "
                "(bmv2_tests/README.md: how to install p4c and BMv2)")
    if os.geteuid() != 0:
        return "BMv2 target skipped: needs root for veth pairs and raw sockets"
    try:
        import p4.v1.p4runtime_pb2  # noqa: F401
    except ImportError:
        return "BMv2 target skipped: the `p4runtime` Python package is not installed"
    return None


def _run(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


# One compile per source text and process: p4c takes 30-50 s, and a test run asks for the same
# program in several places (the conformance target, the seams rows, the controller test,
# test_p4info). Keyed by the sources' bytes, so an edited program is compiled again.
_COMPILED: dict[str, pathlib.Path] = {}


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / "p4src").rglob("*.p4")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def compile_p4(outdir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """p4c-bm2-ss -> (BMv2 JSON, P4Info text), written into outdir."""
    names = ("spina_v1model.json", "spina_v1model.p4info.txtpb")
    key = _sources_digest()
    if key not in _COMPILED:
        build = pathlib.Path(tempfile.mkdtemp(prefix="spina-p4c-"))
        atexit.register(shutil.rmtree, build, True)
        _run("p4c-bm2-ss", "--arch", "v1model", "-o", str(build / names[0]),
             "--p4runtime-files", str(build / names[1]), str(P4_TOP))
        _COMPILED[key] = build
    for name in names:
        shutil.copyfile(_COMPILED[key] / name, outdir / name)
    return outdir / names[0], outdir / names[1]


# The open target, if any: one switch owns the veth pairs at a time.
_LIVE: list["Bmv2Target"] = []


class Bmv2Target(P4RuntimeTarget):
    """simple_switch_grpc with the SpINA program, ports 1..4 on veth pairs."""
    name = "bmv2"
    can_force_qdepth = False
    can_rate_limit = True

    def __init__(self):
        from google.protobuf import text_format
        from p4.config.v1 import p4info_pb2

        # A second switch would take the first one's veth pairs
        # (bmv2_tests' session switch is still up when tests/test_controller_bmv2.py starts its
        # own in the same pytest run): stop the open one first.
        for other in list(_LIVE):
            other.close()
        _LIVE.append(self)
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="spina-bmv2-"))
        self.proc = None
        self.conn = None
        self.net = None  # the veth pairs of its ports (a Graph of PORTS_FILE)
        self.socks: dict[int, socket.socket] = {}
        self._last_port = None
        # Ports of its own, never 9559/9090: a switch or controller another test left running
        # there would otherwise answer in its place.
        grpc_port, self.thrift_port = free_ports(2)
        self.grpc_addr = f"127.0.0.1:{grpc_port}"
        try:
            js, info_path = compile_p4(self.tmp)
            p4info = text_format.Parse(info_path.read_text(), p4info_pb2.P4Info())
            self._setup_links()
            with open(self.tmp / "switch.log", "w") as log:
                self.proc = subprocess.Popen(
                    ["simple_switch_grpc", "--device-id", "0", "--no-p4", "--thrift-port",
                     str(self.thrift_port)]
                    + [a for p in PORTS for a in ("-i", f"{p}@{self._sw_if(p)}")]
                    + ["--", "--grpc-server-addr", self.grpc_addr, "--priority-queues", "8"],
                    stdout=log, stderr=subprocess.STDOUT)
            wait_listening(self.grpc_addr)  # a Connection to a port not listening fails at once
            super().__init__(Connection(self.grpc_addr, 0, election=1),
                             ThriftRegisters(self.thrift_port))
            self.conn.set_pipeline(p4info, js.read_bytes(), cookie=1)
            self._open_sockets()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ plumbing
    def _setup_links(self):
        """The ports' veth pairs: bench/topologies/ports4.yaml, both ends in the root
        namespace (IPv6 off: tests expect "nothing else" on ports; offloads off)."""
        from spina.netgraph import Graph
        from spina.topology import load
        topo = load(str(PORTS_FILE))
        self.net = Graph(topo, netns.unique_tag("bm"), at={h: None for h in topo.hosts})
        self.net.create()
        self._sw_ifs = self.net.ports("s0")
        self._host_ifs = {p: self.net.ifname(i, h) for p, (i, h) in topo.ports("s0").items()}
        if tuple(self._sw_ifs) != PORTS:
            raise ValueError(f"{PORTS_FILE}: ports {tuple(self._sw_ifs)}, the tests use {PORTS}")

    def _sw_if(self, p):
        return self._sw_ifs[p]

    def _host_if(self, p):
        return self._host_ifs[p]

    def _open_sockets(self):
        for p in PORTS:
            s = netns.packet_socket(self._host_if(p))  # its frames only, none of another's
            s.setblocking(False)
            self.socks[p] = s
        time.sleep(0.2)
        self.received(0.1)

    # ------------------------------------------------------------ Target
    def send(self, port, frame):
        # BMv2 takes each port's frames on its own capture thread, so a frame sent on another
        # port right after may be processed first (test_newer_round_resets_copy failed 28 times
        # in 100). The tests mean their sends in order: give the previous frame time to enter
        # the pipeline before one goes in on a different port.
        if self._last_port not in (None, port):
            time.sleep(CROSS_PORT_GAP)
        self._last_port = port
        self.socks[port].send(bytes(frame))

    def received(self, timeout=0.3):
        out, deadline = [], time.monotonic() + timeout
        poller = select.poll()
        by_fd = {s.fileno(): p for p, s in self.socks.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            for fd, _ in poller.poll(left * 1000):
                while True:
                    try:
                        data, addr = self.socks[by_fd[fd]].recvfrom(65536)
                    except BlockingIOError:
                        break
                    if addr[2] != 4:  # not our own transmission
                        out.append((by_fd[fd], data))

    def set_queue_rate(self, port, pps):
        self.registers.run([f"set_queue_rate {pps} {port}"])

    def reset(self):
        self.clear_tables()
        self.registers.reset(spec.p4_register_names() + [r.name for r in spec.SPRAY_REGISTERS])
        self.registers.run([f"counter_reset {c}" for c in spec.COUNTERS]
                           + ["set_queue_rate 0"])  # every queue: no rate limit
        self.received(0.05)

    @property
    def closed(self) -> bool:
        return self not in _LIVE

    def close(self):
        if self in _LIVE:
            _LIVE.remove(self)
        for s in self.socks.values():
            s.close()
        self.socks.clear()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            stop_process(self.proc, 5)
            self.proc = None
        if self.net is not None:
            self.net.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
