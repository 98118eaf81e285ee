"""The BF Runtime gRPC client: a `target: tofino` switch with `api: bfrt`, programmed through
the SDE's own server in bf_switchd (what SDE users run) instead of a P4Runtime server.

`BfrtConnection` answers the calls the controller makes on a P4Runtime `Connection` (pipeline,
write, read, by P4Runtime entities), and turns each entity into BF Runtime's by name:

    P4Runtime (P4Info names)            BF Runtime (bfrt.json names and ids)
    table T, key field K, action A      table pipe.T, key field K, action A (its data fields)
    counter C[i].packet_count           table pipe.C: key $COUNTER_INDEX, $COUNTER_SPEC_PKTS
    register R[i] (bit<W>, or a struct) table pipe.R: key $REGISTER_INDEX, data R.f1 (or the
                                        struct's members R.lo, R.hi in their order)
    multicast group G, replicas (p, r)  fixed tables $pre.node (node NODE_BASE * G + j: rid r,
                                        $DEV_PORT [p]) and $pre.mgid (G: its nodes)

so the controls (controller/controls.py) and the register clears (TofinoRegisters) write the
same entries over either API. Names match as in P4InfoIndex (a full name or a dotted tail),
ids come from the BF-RT JSON the switch reports: the program's (bf-p4c's bfrt.json, pushed by
`set_pipeline`) and the device's fixed tables ($pre.*); nothing here knows an id.

The messages are the SDE's: its install holds the Python modules generated from
bfruntime.proto (bf-drivers src/bf_rt/proto/), `$SDE_INSTALL/lib/python3.*/site-packages/
tofino/bfrt_grpc/bfruntime_pb2{,_grpc}.py`; SDE_INSTALL defaults to $SDE/install, else
/opt/bf-sde/install. Our repository carries no copy of them (the SDE's code is never
committed); without them the client stops with one line naming the path it looked in.

BF Runtime has no cookie: the switch returns the program it runs (p4_name, bfrt.json, each
profile's context.json, tofino.bin and pipe scope), and `get_pipeline` reports the cookie of
that content with our P4Info, so the controller pushes only what differs, as over P4Runtime.
No election either: a client owns a program by binding to it, and the server refuses a second
(ALREADY_EXISTS), which this client reports as another primary (NotPrimaryError). So a
read-only session (status) cannot bind while `serve` holds the program. Register reads take
the first pipe's value (the server repeats the data field once per pipe). Tested against a
fake server in tests/test_controller_bfrt.py only: no bf_switchd or Tofino model runs here.
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import pathlib
import queue
import sys
import threading
import types

import grpc
from p4.v1 import p4runtime_pb2 as pb

from controller.p4rt import (
    NotPrimaryError,
    P4InfoIndex,
    P4RuntimeError,
    read_stream,
    refused,
    rpc,
)
from controller.pipeline import cookie_of
from spina.config import ConfigError
from spina.p4runtime import decode, encode

DEFAULT_SDE_INSTALL = "/opt/bf-sde/install"
PACKAGE = "tofino/bfrt_grpc"
MODULES = ("bfruntime_pb2", "bfruntime_pb2_grpc")
ALL_PIPES = 0xFFFF  # BF_DEV_PIPE_ALL: one entry programmed into every pipe
NODE_BASE = 256  # multicast group G's replica j is PRE node G * NODE_BASE + j


# ---------------------------------------------------------------- the SDE's modules
def sde_install() -> pathlib.Path:
    """Where the SDE is installed: $SDE_INSTALL, else $SDE/install, else the default."""
    if os.environ.get("SDE_INSTALL"):
        return pathlib.Path(os.environ["SDE_INSTALL"])
    if os.environ.get("SDE"):
        return pathlib.Path(os.environ["SDE"]) / "install"
    return pathlib.Path(DEFAULT_SDE_INSTALL)


def sde_package(install: pathlib.Path) -> pathlib.Path | None:
    """The SDE's tofino/bfrt_grpc directory under `install` (this Python's version first), or
    None if no site-packages there holds both generated modules."""
    mine = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = sorted(glob.glob(str(install / "lib" / "python3*" / "site-packages" / PACKAGE)),
                   key=lambda p: mine not in p)
    for d in map(pathlib.Path, found):
        if all((d / f"{m}.py").is_file() for m in MODULES):
            return d
    return None


_loaded: dict[pathlib.Path, tuple] = {}


def load_sde_modules(install: pathlib.Path | None = None):
    """(bfruntime_pb2, bfruntime_pb2_grpc) from the SDE install; ConfigError (one line) naming
    where they were looked for. Imported as a private package, not through sys.path: the SDE's
    top-level `tofino` package would meet our repository's tofino/ directory there."""
    install = install or sde_install()
    d = sde_package(install)
    if d is None:
        raise ConfigError(
            f"BF Runtime client: no {PACKAGE}/bfruntime_pb2.py and bfruntime_pb2_grpc.py under "
            f"{install}/lib/python3.*/site-packages (set SDE_INSTALL to the SDE's install "
            f"directory; default $SDE/install, else {DEFAULT_SDE_INSTALL})")
    if d not in _loaded:
        name = f"_sde_bfrt_grpc_{len(_loaded)}"
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(d)]
        sys.modules[name] = pkg
        _loaded[d] = tuple(importlib.import_module(f"{name}.{m}") for m in MODULES)
    return _loaded[d]


# ---------------------------------------------------------------- the BF-RT JSON
def _width(type_spec: dict) -> int:
    """Bits of a BF-RT field type: bytes of a width, uint8/16/32/64, bool 1; 0 for the
    types no entry here carries (string, float, containers)."""
    kind = type_spec.get("type", "")
    if kind == "bytes":
        return type_spec["width"]
    if kind == "bool":
        return 1
    return int(kind[4:]) if kind.startswith("uint") and kind[4:].isdigit() else 0


def _tails(name: str):
    """A dotted name and every dotted tail of it: pipe.Ingress.t, Ingress.t, t."""
    parts = name.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


class BfrtTable:
    """One BF-RT table: its id, key fields, actions and data fields by name."""

    def __init__(self, t: dict):
        self.name, self.id, self.size = t["name"], t["id"], t.get("size", 0)
        self.keys = {k["name"]: (k["id"], _width(k.get("type", {}))) for k in t.get("key", [])}
        self.actions: dict[str, tuple[int, dict]] = {}
        for a in t.get("action_specs", []):
            params = {p["name"]: (p["id"], _width(p.get("type", {}))) for p in a["data"]}
            for n in _tails(a["name"]):
                self.actions.setdefault(n, (a["id"], params))
        self.data = [(d["singleton"]["name"], d["singleton"]["id"],
                      _width(d["singleton"].get("type", {})))
                     for d in t.get("data", []) if "singleton" in d]

    def key(self, name: str) -> tuple[int, int]:
        if name not in self.keys:
            raise KeyError(f"BF-RT table {self.name} has no key field {name!r}")
        return self.keys[name]

    def action(self, name: str) -> tuple[int, dict]:
        for n in _tails(name):
            if n in self.actions:
                return self.actions[n]
        raise KeyError(f"BF-RT table {self.name} has no action {name!r}")

    def field(self, name: str) -> tuple[int, int]:
        for n, i, w in self.data:
            if n == name:
                return i, w
        raise KeyError(f"BF-RT table {self.name} has no data field {name!r}")


class BfrtSchema:
    """Tables of BF-RT JSON documents (the program's bfrt.json, the device's fixed tables) by
    full name or any dotted tail of it."""

    def __init__(self, *documents: bytes):
        self._by: dict[str, BfrtTable] = {}
        self.by_id: dict[int, BfrtTable] = {}
        for doc in documents:
            for t in json.loads(doc or b'{"tables": []}').get("tables", []):
                table = self.by_id[t["id"]] = BfrtTable(t)
                for n in _tails(t["name"]):
                    self._by.setdefault(n, table)

    def table(self, name: str) -> BfrtTable:
        for n in _tails(name):
            if n in self._by:
                return self._by[n]
        raise KeyError(f"the switch's BF-RT JSON has no table {name!r}")


def _bytes(value: int, width: int) -> bytes:
    """A value as BF Runtime takes it: big-endian, in the field's whole bytes."""
    return value.to_bytes((width + 7) // 8, "big")


# ---------------------------------------------------------------- the connection
class BfrtConnection:
    """One BF Runtime session with one device, called as a P4Runtime `Connection` is.

    Args:
        address: 'host:port' of bf_switchd's BF Runtime server (its default port is 50052).
        device_id: the device.
        election: our client id (BF Runtime's); None: a read-only session, writes refused.
        timeout, rpc_timeout: as for Connection.
        p4info: the program's P4Info: the names the controls use.
        device_config: what `set_pipeline` would push (tofino.bfrt_config): its p4_name is the
            program this session binds to.
        install: the SDE install holding the Python modules (default: sde_install()).
    """

    def __init__(self, address: str, device_id: int = 0, election: int | None = 1,
                 timeout: float = 10.0, *, p4info, device_config: bytes,
                 install: pathlib.Path | None = None, rpc_timeout: float = 60.0):
        self.bf, bf_grpc = load_sde_modules(install)
        self.address, self.device_id, self.election = address, device_id, election
        self.client_id = election or 0
        self.timeout, self.rpc_timeout = timeout, rpc_timeout
        self.p4info = p4info
        self.program = self.bf.ForwardingPipelineConfig.FromString(device_config).p4_name
        self.index: P4InfoIndex | None = None
        self.schema: BfrtSchema | None = None
        self._bound = False
        self.stream_lost: str | None = None
        why = refused(address, min(timeout, 1.0))
        if why is not None:
            raise P4RuntimeError(f"no BF Runtime server at {address}: {why} (is bf_switchd "
                                 "running?)")
        self.channel = grpc.insecure_channel(address)
        self.stub = bf_grpc.BfRuntimeStub(self.channel)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise P4RuntimeError(f"no BF Runtime server at {address} within {timeout:g} s") \
                from None
        # The stream makes us a known client (the server forgets an unsubscribed one).
        self._out: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()  # Subscribe answers
        self._commits: queue.Queue = queue.Queue()  # a push's WARM_INIT_FINISHED notices
        self._stream = self.stub.StreamChannel(iter(self._out.get, None))
        self._reader = threading.Thread(target=self._read_stream, daemon=True,
                                        name=f"bfrt-{address}")
        self._reader.start()
        try:
            self._subscribe()
        except P4RuntimeError:
            self.close()
            raise

    def _subscribe(self) -> None:
        self._out.put(self.bf.StreamMessageRequest(
            client_id=self.client_id, subscribe=self.bf.Subscribe(device_id=self.device_id)))
        try:
            sub = self._answers.get(timeout=self.timeout)
        except queue.Empty:
            raise P4RuntimeError(f"{self.address}: no answer to Subscribe within "
                                 f"{self.timeout:g} s") from None
        if isinstance(sub, grpc.RpcError):
            raise P4RuntimeError(f"{self.address}: Subscribe: {sub.code().name}: "
                                 f"{sub.details()}", sub.code())
        if sub.status.code != 0:
            raise P4RuntimeError(f"{self.address}: Subscribe refused: {sub.status.message}")

    def _read_stream(self):
        self.stream_lost = read_stream(
            self._stream, {"subscribe": self._answers,
                           "set_forwarding_pipeline_config_response": self._commits},
            self._answers)

    def require_primary(self) -> None:
        if self.election is None:
            raise NotPrimaryError(f"{self.address}: a read-only session (no client id) "
                                  "writes nothing")
        if self.stream_lost is not None:
            raise P4RuntimeError(f"{self.address}: our BF Runtime stream ended "
                                 f"({self.stream_lost}; did the switch restart?): reconnect")

    def close(self) -> None:
        self._out.put(None)
        self._stream.cancel()
        self.channel.close()
        self._reader.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ pipeline
    def _switch_config(self):
        """(the switch's config of our program or None, its fixed tables' BF-RT JSON)."""
        resp = rpc("GetForwardingPipelineConfig", self.stub.GetForwardingPipelineConfig,
                    self.bf.GetForwardingPipelineConfigRequest(device_id=self.device_id,
                                                               client_id=self.client_id),
                    timeout=self.rpc_timeout)
        mine = [c for c in resp.config if c.p4_name == self.program]
        return (mine[0] if mine else None), resp.non_p4_config.bfruntime_info

    def get_pipeline(self):
        """The program the switch runs as P4Runtime's ForwardingPipelineConfig: our P4Info, and
        the cookie of the switch's content (controller.pipeline.cookie_of), None if it runs no
        program of our name."""
        cur, _ = self._switch_config()
        if cur is None:
            return None
        out = pb.ForwardingPipelineConfig(p4info=self.p4info)
        out.cookie.cookie = cookie_of(self.p4info, cur.SerializeToString(deterministic=True))
        return out

    def set_pipeline(self, p4info, device_config: bytes, cookie: int) -> None:
        """Push bf-p4c's files (VERIFY_AND_WARM_INIT_BEGIN_AND_END: the device starts the
        program with empty tables), wait for the server's WARM_INIT_FINISHED on our stream
        (the RPC returns before the device is ready, as the SDE's own client knows), then bind
        to it. `cookie` is implied by the content."""
        self.require_primary()
        req = self.bf.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, client_id=self.client_id,
            action=self.bf.SetForwardingPipelineConfigRequest.VERIFY_AND_WARM_INIT_BEGIN_AND_END)
        req.config.add().ParseFromString(device_config)
        while not self._commits.empty():  # notices of earlier pushes
            self._commits.get_nowait()
        rpc("SetForwardingPipelineConfig", self.stub.SetForwardingPipelineConfig, req,
             timeout=self.rpc_timeout)
        finished = self.bf.SetForwardingPipelineConfigResponseType.Value("WARM_INIT_FINISHED")
        try:
            while self._commits.get(timeout=self.timeout) \
                    .set_forwarding_pipeline_config_response_type != finished:
                pass
        except queue.Empty:
            raise P4RuntimeError(f"{self.address}: pushed {self.program}, but no "
                                 f"WARM_INIT_FINISHED within {self.timeout:g} s") from None
        self.use_pipeline(p4info)

    def use_pipeline(self, p4info) -> None:
        """Bind to our program (once: a bound client stays bound across pushes) and index the
        names: the P4Info's, and the BF-RT JSON the switch reports."""
        if not self._bound:
            req = self.bf.SetForwardingPipelineConfigRequest(
                device_id=self.device_id, client_id=self.client_id,
                action=self.bf.SetForwardingPipelineConfigRequest.BIND)
            req.config.add(p4_name=self.program)
            try:
                self.stub.SetForwardingPipelineConfig(req, timeout=self.rpc_timeout)
            except grpc.RpcError as e:
                why = f"{self.address}: binding to {self.program}: {e.code().name}: {e.details()}"
                if e.code() == grpc.StatusCode.ALREADY_EXISTS:  # another client owns it
                    raise NotPrimaryError(f"{why} (another client owns the program; refusing "
                                          "to write)", e.code()) from None
                raise P4RuntimeError(why, e.code()) from None
            self._bound = True
        cur, fixed = self._switch_config()
        if cur is None:
            raise P4RuntimeError(f"{self.address}: the switch runs no program {self.program}")
        self.p4info, self.index = p4info, P4InfoIndex(p4info)
        self.schema = BfrtSchema(cur.bfruntime_info, fixed)

    # ------------------------------------------------------------ RPCs
    def _target(self):
        return self.bf.TargetDevice(device_id=self.device_id, pipe_id=ALL_PIPES,
                                    direction=0xFF, prsr_id=0xFF)

    def write(self, updates: list) -> None:
        """One WriteRequest holding the BF Runtime form of `updates` ([(P4Runtime
        Update.Type, Entity)]); nothing if empty."""
        if not updates:
            return
        self.require_primary()
        req = self.bf.WriteRequest(target=self._target(), client_id=self.client_id,
                                   p4_name=self.program)
        for kind, ent in updates:
            for bf_kind, entry in self._by_name(self._to_bfrt, kind, ent):
                req.updates.add(type=bf_kind).entity.table_entry.CopyFrom(entry)
        rpc("Write", self.stub.Write, req, timeout=self.rpc_timeout)

    def _read_bfrt(self, entries: list) -> list:
        req = self.bf.ReadRequest(target=self._target(), client_id=self.client_id,
                                  p4_name=self.program)
        for e in entries:
            req.entities.add().table_entry.CopyFrom(e)

        def run():
            return [e.table_entry for resp in self.stub.Read(req, timeout=self.rpc_timeout)
                    for e in resp.entities]
        return rpc("Read", run)

    def read(self, entities: list) -> list:
        """The P4Runtime entities the switch holds for the P4Runtime `entities` queried."""
        out = []
        for q in entities:
            kind = q.WhichOneof("entity")
            if kind == "packet_replication_engine_entry":
                grp = q.packet_replication_engine_entry.multicast_group_entry.multicast_group_id
                out += [pb.Entity(packet_replication_engine_entry=pb.PacketReplicationEngineEntry(
                    multicast_group_entry=g)) for g in self._by_name(self._groups)
                    if grp in (0, g.multicast_group_id)]
                continue
            query, back = self._by_name(self._query, kind, getattr(q, kind))
            out += [back(e) for e in self._read_bfrt([query])]
        return out

    def read_table(self, table: str) -> list:
        q = pb.Entity(table_entry=pb.TableEntry(table_id=self.index.id("tables", table)))
        return [e.table_entry for e in self.read([q])]

    def read_counters(self, name: str, indices) -> dict[int, int]:
        qs = []
        for i in indices:
            e = pb.Entity()
            e.counter_entry.counter_id = self.index.id("counters", name)
            e.counter_entry.index.index = i
            qs.append(e)
        return {e.counter_entry.index.index: e.counter_entry.data.packet_count
                for e in self.read(qs)} if qs else {}

    def read_groups(self) -> list:
        return self._by_name(self._groups)

    # ------------------------------------------------------------ P4Runtime -> BF Runtime
    def _by_name(self, f, *args):
        """f(*args), a name the BF-RT JSON lacks (KeyError) as one line naming it."""
        try:
            return f(*args)
        except KeyError as e:
            raise ConfigError(f"{self.address}: {e.args[0]} (is the switch's bfrt.json from the "
                              "compile that wrote the P4Info?)") from None

    def _table_of(self, kind: str, obj_id: int) -> tuple[str, BfrtTable]:
        name = self.index.name(kind, obj_id)
        try:
            return name, self.schema.table(name)
        except KeyError as e:
            raise ConfigError(f"{e.args[0]} (the P4Info's {kind[:-1]} {name!r}: is bfrt.json "
                              "from the same compile?)") from None

    def _key(self, table: BfrtTable, name: str, value: int):
        k = self.bf.KeyField(field_id=table.key(name)[0])
        k.exact.value = _bytes(value, table.key(name)[1])
        return k

    def _to_bfrt(self, kind, ent) -> list:
        """[(BF Runtime Update.Type, TableEntry)] for one P4Runtime update."""
        bf_kind = {pb.Update.INSERT: self.bf.Update.INSERT,
                   pb.Update.MODIFY: self.bf.Update.MODIFY,
                   pb.Update.DELETE: self.bf.Update.DELETE}[kind]
        which = ent.WhichOneof("entity")
        if which == "table_entry":
            return [(bf_kind, self._table_entry(ent.table_entry, kind != pb.Update.DELETE))]
        if which == "counter_entry":
            c = ent.counter_entry
            _, t = self._table_of("counters", c.counter_id)
            e = self.bf.TableEntry(table_id=t.id)
            e.key.fields.append(self._key(t, "$COUNTER_INDEX", c.index.index))
            fid, w = t.field("$COUNTER_SPEC_PKTS")
            e.data.fields.add(field_id=fid, stream=_bytes(c.data.packet_count, w))
            return [(bf_kind, e)]
        if which == "register_entry":
            return self._register_writes(bf_kind, ent.register_entry)
        if which == "packet_replication_engine_entry":
            return self._group_writes(kind, ent.packet_replication_engine_entry
                                      .multicast_group_entry)
        raise ValueError(f"BF Runtime client: no mapping for a P4Runtime {which}")

    def _table_entry(self, te, with_data: bool):
        name, t = self._table_of("tables", te.table_id)
        info = self.index.get("tables", name)
        fields = {f.id: f for f in info.match_fields}
        e = self.bf.TableEntry(table_id=t.id, is_default_entry=te.is_default_action)
        for m in te.match:
            f = fields[m.field_id]
            fid, w = t.key(f.name)
            k = e.key.fields.add(field_id=fid)
            if m.HasField("lpm"):
                k.lpm.value, k.lpm.prefix_len = _bytes(decode(m.lpm.value), w), m.lpm.prefix_len
            else:
                k.exact.value = _bytes(decode(m.exact.value), w)
        if with_data and te.HasField("action"):
            a = self.index.get("actions", self.index.name("actions", te.action.action.action_id))
            aid, params = t.action(a.preamble.name)
            e.data.action_id = aid
            pname = {p.id: p.name for p in a.params}
            for p in te.action.action.params:
                fid, w = params[pname[p.param_id]]
                e.data.fields.add(field_id=fid, stream=_bytes(decode(p.value), w))
        return e

    def _register_writes(self, bf_kind, r) -> list:
        name, t = self._table_of("registers", r.register_id)
        members = ([m.bitstring for m in r.data.struct.members] if r.data.HasField("struct")
                   else [r.data.bitstring])
        if len(members) != len(t.data):
            raise ConfigError(f"register {name}: {len(members)} values for the BF-RT table's "
                              f"{len(t.data)} data fields")
        # No index: every cell (P4Runtime's whole-register write), one entry per cell.
        cells = [r.index.index] if r.HasField("index") else range(t.size)
        out = []
        for i in cells:
            e = self.bf.TableEntry(table_id=t.id)
            e.key.fields.append(self._key(t, "$REGISTER_INDEX", i))
            for (_, fid, w), v in zip(t.data, members):
                e.data.fields.add(field_id=fid, stream=_bytes(decode(v), w))
            out.append((bf_kind, e))
        return out

    def _query(self, kind: str, q):
        """(a BF Runtime read entry, its answer -> the P4Runtime Entity) for a P4Runtime
        query of a table, counter or register."""
        if kind == "table_entry":
            name, t = self._table_of("tables", q.table_id)
            if q.is_default_action:
                return self.bf.TableEntry(table_id=t.id, is_default_entry=True), \
                    lambda e: pb.Entity(table_entry=self._from_bfrt_entry(name, t, e))
            return self.bf.TableEntry(table_id=t.id), \
                lambda e: pb.Entity(table_entry=self._from_bfrt_entry(name, t, e))
        kinds = {"counter_entry": ("counters", "counter_id", "$COUNTER_INDEX"),
                 "register_entry": ("registers", "register_id", "$REGISTER_INDEX")}
        if kind not in kinds or not q.HasField("index"):
            raise ValueError(f"BF Runtime client: no mapping for a P4Runtime {kind} read")
        p4_kind, id_field, key = kinds[kind]
        name, t = self._table_of(p4_kind, getattr(q, id_field))
        e = self.bf.TableEntry(table_id=t.id)
        e.key.fields.append(self._key(t, key, q.index.index))
        e.table_flags.from_hw = True  # the counter or register cell itself, not a cache

        def back(got):
            out = pb.Entity()
            first = {}
            for f in got.data.fields:  # one per pipe for a register: the first pipe's
                first.setdefault(f.field_id, decode(f.stream))
            if kind == "counter_entry":
                out.counter_entry.CopyFrom(q)
                out.counter_entry.data.packet_count = first.get(t.field("$COUNTER_SPEC_PKTS")[0],
                                                                0)
                return out
            out.register_entry.CopyFrom(q)
            r = self.index.get("registers", name)
            values = [first.get(fid, 0) for _, fid, _ in t.data]
            if r.type_spec.HasField("struct"):
                for v in values:
                    out.register_entry.data.struct.members.add().bitstring = encode(v, 64)
            else:
                out.register_entry.data.bitstring = encode(values[0], 64)
            return out
        return e, back

    def _from_bfrt_entry(self, name: str, t: BfrtTable, e) -> pb.TableEntry:
        """A BF Runtime entry of table `t` as the P4Runtime TableEntry of P4 table `name`."""
        info = self.index.get("tables", name)
        te = pb.TableEntry(table_id=info.preamble.id, is_default_action=e.is_default_entry)
        key_ids = {t.key(f.name)[0]: f for f in info.match_fields}
        for k in e.key.fields:
            f = key_ids[k.field_id]
            m = te.match.add(field_id=f.id)
            if k.HasField("lpm"):
                m.lpm.value, m.lpm.prefix_len = encode(decode(k.lpm.value), f.bitwidth), \
                    k.lpm.prefix_len
            else:
                m.exact.value = encode(decode(k.exact.value), f.bitwidth)
        for a in (self.index.get("actions", self.index.name("actions", ref.id))
                  for ref in info.action_refs):
            aid, params = t.actions.get(a.preamble.name.rsplit(".", 1)[-1], (None, {}))
            if aid is None or aid != e.data.action_id:
                continue
            te.action.action.action_id = a.preamble.id
            by_id = {params[p.name][0]: p for p in a.params}
            for f in e.data.fields:
                if f.field_id in by_id:
                    p = by_id[f.field_id]
                    te.action.action.params.add(param_id=p.id,
                                                value=encode(decode(f.stream), p.bitwidth))
            break
        return te

    # ------------------------------------------------------------ the PRE
    def _pre(self, name: str) -> BfrtTable:
        return self.schema.table(name)

    def _groups(self) -> list:
        """Every multicast group the PRE holds, as P4Runtime MulticastGroupEntry (replicas:
        each node's first $DEV_PORT and its $MULTICAST_RID)."""
        mgid, node = self._pre("$pre.mgid"), self._pre("$pre.node")
        nodes = {}
        f_rid, f_port = node.field("$MULTICAST_RID")[0], node.field("$DEV_PORT")[0]
        for e in self._read_bfrt([self.bf.TableEntry(table_id=node.id)]):
            d = {f.field_id: f for f in e.data.fields}
            ports = list(d[f_port].int_arr_val.val) if f_port in d else []
            nodes[decode(e.key.fields[0].exact.value)] = (
                ports[0] if ports else None, decode(d[f_rid].stream) if f_rid in d else 0)
        f_nodes = mgid.field("$MULTICAST_NODE_ID")[0]
        out = []
        for e in self._read_bfrt([self.bf.TableEntry(table_id=mgid.id)]):
            g = pb.MulticastGroupEntry(multicast_group_id=decode(e.key.fields[0].exact.value))
            ids = next(f.int_arr_val.val for f in e.data.fields if f.field_id == f_nodes)
            for n in ids:
                port, rid = nodes.get(n, (None, 0))
                if port is not None:  # a node we did not write (no port, or gone): not ours
                    g.replicas.add(egress_port=port, instance=rid)
            out.append(g)
        return out

    def _group_writes(self, kind, g) -> list:
        """A P4Runtime group write as PRE node and group entries: an insert makes the nodes,
        then the group; a delete removes the group, then its nodes; a modify is both."""
        mgid, node = self._pre("$pre.mgid"), self._pre("$pre.node")
        grp = g.multicast_group_id
        if len(g.replicas) > NODE_BASE:
            raise ConfigError(f"multicast group {grp}: {len(g.replicas)} replicas, at most "
                              f"{NODE_BASE} per group here")
        out = []
        if kind in (pb.Update.DELETE, pb.Update.MODIFY):
            old = next((x for x in self._groups() if x.multicast_group_id == grp), None)
            n_old = len(old.replicas) if old is not None else 0
            e = self.bf.TableEntry(table_id=mgid.id)
            e.key.fields.append(self._key(mgid, "$MGID", grp))
            out.append((self.bf.Update.DELETE, e))
            for j in range(n_old):
                e = self.bf.TableEntry(table_id=node.id)
                e.key.fields.append(self._key(node, "$MULTICAST_NODE_ID", grp * NODE_BASE + j))
                out.append((self.bf.Update.DELETE, e))
        if kind in (pb.Update.INSERT, pb.Update.MODIFY):
            ids = []
            for j, r in enumerate(g.replicas):
                ids.append(grp * NODE_BASE + j)
                e = self.bf.TableEntry(table_id=node.id)
                e.key.fields.append(self._key(node, "$MULTICAST_NODE_ID", ids[-1]))
                e.data.fields.add(field_id=node.field("$MULTICAST_RID")[0],
                                  stream=_bytes(r.instance, node.field("$MULTICAST_RID")[1]))
                e.data.fields.add(field_id=node.field("$MULTICAST_LAG_ID")[0]).int_arr_val.SetInParent()
                e.data.fields.add(field_id=node.field("$DEV_PORT")[0]).int_arr_val.val.append(
                    r.egress_port)
                out.append((self.bf.Update.INSERT, e))
            e = self.bf.TableEntry(table_id=mgid.id)
            e.key.fields.append(self._key(mgid, "$MGID", grp))
            e.data.fields.add(field_id=mgid.field("$MULTICAST_NODE_ID")[0]).int_arr_val.val.extend(
                ids)
            e.data.fields.add(field_id=mgid.field("$MULTICAST_NODE_L1_XID_VALID")[0]) \
                .bool_arr_val.val.extend([False] * len(ids))
            e.data.fields.add(field_id=mgid.field("$MULTICAST_NODE_L1_XID")[0]) \
                .int_arr_val.val.extend([0] * len(ids))
            out.append((self.bf.Update.INSERT, e))
        return out
