"""The BMv2 target: simple_switch_grpc running p4src/v1model/spina_v1model.p4 on veth pairs.

Tables, default actions, multicast groups and counters go through P4Runtime (gRPC on
127.0.0.1:9559); registers through the Thrift runtime (simple_switch_CLI on port 9090),
because BMv2's P4Runtime server answers UNIMPLEMENTED to register reads and writes.

Needs root (veth pairs, raw sockets), `p4c-bm2-ss`, `simple_switch_grpc` and
`simple_switch_CLI` on PATH. `unavailable()` says why not, for the skip message.
"""
from __future__ import annotations

import ipaddress
import os
import pathlib
import select
import shutil
import socket
import subprocess
import tempfile
import time

from bmv2_tests.target import PORTS, Target
from spina import spec
from softswitch.l2 import mac_bytes
from spina.procs import stop_process

ROOT = pathlib.Path(__file__).resolve().parents[1]
P4_TOP = ROOT / "p4src" / "v1model" / "spina_v1model.p4"
GRPC_ADDR = "127.0.0.1:9559"
THRIFT_PORT = 9090
TOOLS = ("p4c-bm2-ss", "simple_switch_grpc", "simple_switch_CLI")


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


def compile_p4(outdir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """p4c-bm2-ss -> (BMv2 JSON, P4Info text)."""
    js, info = outdir / "spina_v1model.json", outdir / "spina_v1model.p4info.txtpb"
    _run("p4c-bm2-ss", "--arch", "v1model", "-o", str(js), "--p4runtime-files", str(info),
         str(P4_TOP))
    return js, info


def _encode(value, width: int) -> bytes:
    """P4Runtime canonical bytestring: big-endian, no leading zero bytes (at least one)."""
    if isinstance(value, (bytes, bytearray)):
        value = int.from_bytes(value, "big")
    elif isinstance(value, str):
        value = (int.from_bytes(mac_bytes(value), "big") if ":" in value
                 else int(ipaddress.IPv4Address(value)))
    value = int(value)
    if value >> width:
        raise ValueError(f"{value} does not fit {width} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


# The open target, if any: one switch owns the veth pairs and ports 9559/9090 at a time.
_LIVE: list["Bmv2Target"] = []


class Bmv2Target(Target):
    """simple_switch_grpc with the SpINA program, ports 1..4 on veth pairs."""
    name = "bmv2"
    can_force_qdepth = False
    can_rate_limit = True

    def __init__(self):
        from google.protobuf import text_format
        import grpc
        from p4.config.v1 import p4info_pb2
        from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

        self.pb = p4runtime_pb2
        # A second switch would fail to bind 9559/9090 and take the first one's veth pairs
        # (bmv2_tests' session switch is still up when tests/test_controller_bmv2.py starts its
        # own in the same pytest run): stop the open one first.
        for other in list(_LIVE):
            other.close()
        _LIVE.append(self)
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="spina-bmv2-"))
        self.proc = None
        self.links: list[str] = []
        self.socks: dict[int, socket.socket] = {}
        self._written: list = []  # table entries to delete on reset
        self._groups: set[int] = set()
        try:
            js, info_path = compile_p4(self.tmp)
            self.p4info = text_format.Parse(info_path.read_text(), p4info_pb2.P4Info())
            self._setup_links()
            with open(self.tmp / "switch.log", "w") as log:
                self.proc = subprocess.Popen(
                    ["simple_switch_grpc", "--device-id", "0", "--no-p4", "--thrift-port",
                     str(THRIFT_PORT)]
                    + [a for p in PORTS for a in ("-i", f"{p}@{self._sw_if(p)}")]
                    + ["--", "--grpc-server-addr", GRPC_ADDR, "--priority-queues", "8"],
                    stdout=log, stderr=subprocess.STDOUT)
            self.channel = grpc.insecure_channel(GRPC_ADDR)
            grpc.channel_ready_future(self.channel).result(timeout=10)
            self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
            self._arbitrate()
            cfg = p4runtime_pb2.ForwardingPipelineConfig(p4info=self.p4info,
                                                         p4_device_config=js.read_bytes())
            self.stub.SetForwardingPipelineConfig(p4runtime_pb2.SetForwardingPipelineConfigRequest(
                device_id=0, election_id=self._election,
                action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
                config=cfg))
            self._open_sockets()
        except Exception:
            self.close()
            raise

    # ------------------------------------------------------------ plumbing
    @staticmethod
    def _sw_if(p):
        return f"sptf{p}s"

    @staticmethod
    def _host_if(p):
        return f"sptf{p}h"

    def _setup_links(self):
        for p in PORTS:
            a, b = self._sw_if(p), self._host_if(p)
            _run("ip", "link", "del", a, check=False)
            _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            self.links.append(a)
            for i in (a, b):
                # No IPv6 autoconfiguration chatter: tests expect "nothing else" on ports.
                _run("sysctl", "-w", f"net.ipv6.conf.{i}.disable_ipv6=1", check=False)
                _run("ip", "link", "set", i, "up")
                _run("ethtool", "-K", i, "tx", "off", check=False)

    def _arbitrate(self):
        import queue
        import threading
        self._election = self.pb.Uint128(high=0, low=1)
        self._stream_q: queue.Queue = queue.Queue()
        req = self.pb.StreamMessageRequest(arbitration=self.pb.MasterArbitrationUpdate(
            device_id=0, election_id=self._election))
        self._stream_q.put(req)

        def requests():
            while True:
                item = self._stream_q.get()
                if item is None:
                    return
                yield item

        self._stream = self.stub.StreamChannel(requests())
        first = threading.Event()

        def drain():
            try:
                for _ in self._stream:
                    first.set()
            except Exception:
                first.set()
        threading.Thread(target=drain, daemon=True).start()
        first.wait(10)

    def _open_sockets(self):
        for p in PORTS:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
            s.bind((self._host_if(p), 0))
            s.setblocking(False)
            self.socks[p] = s
        time.sleep(0.2)
        self.received(0.1)

    def _id(self, kind: str, name: str) -> int:
        for e in getattr(self.p4info, kind):
            if e.preamble.name == name or e.preamble.name.endswith("." + name):
                return e.preamble.id
        raise KeyError(f"P4Info has no {kind[:-1]} {name!r}")

    def _write(self, update_type, entity):
        req = self.pb.WriteRequest(device_id=0, election_id=self._election)
        up = req.updates.add()
        up.type = update_type
        up.entity.CopyFrom(entity)
        self.stub.Write(req)

    def _table_entry(self, table, key, action=None, params=None):
        t = spec.TABLES[table]
        e = self.pb.TableEntry(table_id=self._id("tables", table))
        for i, k in enumerate(t.keys, start=1):
            m = e.match.add(field_id=i)
            v = key[k.name]
            if k.match == "lpm":
                net = ipaddress.IPv4Network(v, strict=False)
                m.lpm.value = _encode(int(net.network_address), 32)
                m.lpm.prefix_len = net.prefixlen
            else:
                m.exact.value = _encode(v, k.width)
        if action is not None:
            a = spec.ACTIONS[action]
            e.action.action.action_id = self._id("actions", action)
            for i, (pname, width) in enumerate(a.params, start=1):
                e.action.action.params.add(param_id=i, value=_encode(params[pname], width))
        return e

    # ------------------------------------------------------------ Target
    def table_add(self, table, key, action, params=None):
        e = self._table_entry(table, key, action, params or {})
        self._write(self.pb.Update.INSERT, self.pb.Entity(table_entry=e))
        self._written.append(self._table_entry(table, key))

    def table_set_default(self, table, action, params=None):
        e = self._table_entry(table, {}, action, params or {})
        e.is_default_action = True
        self._write(self.pb.Update.MODIFY, self.pb.Entity(table_entry=e))

    def mcast_group_set(self, grp, replicas):
        g = self.pb.MulticastGroupEntry(multicast_group_id=grp)
        for port, rid in replicas:
            g.replicas.add(egress_port=port, instance=rid)
        ent = self.pb.Entity(packet_replication_engine_entry=self.pb.PacketReplicationEngineEntry(
            multicast_group_entry=g))
        self._write(self.pb.Update.MODIFY if grp in self._groups else self.pb.Update.INSERT, ent)
        self._groups.add(grp)

    def send(self, port, frame):
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

    def counter(self, name, index):
        req = self.pb.ReadRequest(device_id=0)
        c = req.entities.add().counter_entry
        c.counter_id = self._id("counters", name)
        c.index.index = index
        for resp in self.stub.Read(req):
            for ent in resp.entities:
                return int(ent.counter_entry.data.packet_count)
        return 0

    def _cli(self, commands: list[str]) -> str:
        return _run("simple_switch_CLI", "--thrift-port", str(THRIFT_PORT),
                    input="\n".join(commands) + "\n").stdout

    def register(self, name, index):
        out = self._cli([f"register_read {name} {index}"])
        for line in out.splitlines():
            if "=" in line and name in line:
                return int(line.rsplit("=", 1)[1].strip())
        raise RuntimeError(f"register_read {name} {index}: {out.strip()}")

    def set_queue_rate(self, port, pps):
        self._cli([f"set_queue_rate {pps} {port}"])

    def reset(self):
        for e in reversed(self._written):
            try:
                self._write(self.pb.Update.DELETE, self.pb.Entity(table_entry=e))
            except Exception:
                pass
        self._written.clear()
        for grp in self._groups:
            ent = self.pb.Entity(packet_replication_engine_entry=self.pb.PacketReplicationEngineEntry(
                multicast_group_entry=self.pb.MulticastGroupEntry(multicast_group_id=grp)))
            try:
                self._write(self.pb.Update.DELETE, ent)
            except Exception:
                pass
        self._groups.clear()
        self.table_set_default("congestion", "set_qdepth_threshold", {"qdepth": spec.QDEPTH_NEVER})
        self._cli([f"register_reset {r}" for r in spec.p4_register_names()]
                  + [f"counter_reset {c}" for c in spec.COUNTERS]
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
        if getattr(self, "_stream_q", None) is not None:
            self._stream_q.put(None)
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        if self.proc is not None:
            stop_process(self.proc, 5)
            self.proc = None
        for a in self.links:
            _run("ip", "link", "del", a, check=False)
        self.links.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)
