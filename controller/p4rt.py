"""A thin P4Runtime client: one connection per switch, master arbitration, typed errors, and a
P4Info index that turns names into IDs (nothing here knows an ID in advance).

Many instances may live in one process (one per switch): no module-level client.
"""
from __future__ import annotations

import difflib
import ipaddress
import logging
import queue
import socket
import threading
import time

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as pb, p4runtime_pb2_grpc

from spina.fields import ConfigError
from spina.p4runtime import P4RuntimeError, encode

log = logging.getLogger("spina.controller.p4rt")
SHOWN_NAMES = 16  # an unknown name's error lists the known ones up to this many


class NotPrimaryError(P4RuntimeError):
    """Another controller is primary for this device: we refuse to write."""


class P4InfoError(ConfigError):
    """What the P4Info does not have: a table, action, counter or register (`kind`, `name`),
    a table's key field or an action's parameter, or a value too wide for its field. The
    message is one line naming it and, for a name, the names the P4Info has (the closest
    first, when there are many)."""

    def __init__(self, msg: str, kind: str, name: str):
        super().__init__(msg)
        self.kind, self.name = kind, name


def known_names(name: str, names) -> str:
    """`names` for an error about `name`: all of them sorted, or, when there are more than
    SHOWN_NAMES, the closest few and how many there are."""
    names = sorted(set(names))
    if len(names) <= SHOWN_NAMES:
        return ", ".join(names) or "none"
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    return f"{', '.join(close) + ', ' if close else ''}... {len(names)} in all"


def rpc(what: str, f, *args, **kwargs):
    """f(*args, **kwargs), a gRPC call; its failure as P4RuntimeError (NotPrimaryError when
    another controller is primary) naming `what` and the status."""
    try:
        return f(*args, **kwargs)
    except grpc.RpcError as e:
        code = e.code()
        cls = NotPrimaryError if code == grpc.StatusCode.PERMISSION_DENIED else P4RuntimeError
        raise cls(f"{what}: {code.name}: {e.details()}", code) from None


def read_stream(stream, queues: dict, errors) -> str:
    """Hand each message of a switch's stream to the queue of the field it carries (`queues`:
    field name -> queue) until the stream ends; an error other than our own cancel is put in
    `errors` (the caller waiting on it learns at once). Returns why the stream ended (the
    clients' `stream_lost`)."""
    try:
        for msg in stream:
            for name, q in queues.items():
                if msg.HasField(name):
                    q.put(getattr(msg, name))
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            errors.put(e)
        return f"{e.code().name}: {e.details()}"
    return "the switch closed the stream"


# ---------------------------------------------------------------- P4Info index
class P4InfoIndex:
    """Names -> P4Info objects. A name matches a full name or its last dotted component, so
    the same code works with global @names ('admission') and control-prefixed ones
    ('SpinaIngress.admission_ctl.admission')."""

    KINDS = ("tables", "actions", "counters", "registers")

    def __init__(self, p4info):
        self.p4info = p4info
        self._by = {k: {} for k in self.KINDS}
        for kind in self.KINDS:
            for obj in getattr(p4info, kind):
                name = obj.preamble.name
                self._by[kind][name] = obj
                self._by[kind].setdefault(name.rsplit(".", 1)[-1], obj)

    def get(self, kind: str, name: str):
        """The P4Info object of `kind` (KINDS) named `name`; P4InfoError naming both and the
        names it has."""
        obj = self._by[kind].get(name)
        if obj is None:
            short = (o.preamble.name.rsplit(".", 1)[-1] for o in getattr(self.p4info, kind))
            raise P4InfoError(f"P4Info has no {kind[:-1]} named {name!r} ({kind}: "
                              f"{known_names(name, short)})", kind, name)
        return obj

    def id(self, kind: str, name: str) -> int:
        return self.get(kind, name).preamble.id

    def name(self, kind: str, obj_id: int) -> str:
        for obj in getattr(self.p4info, kind):
            if obj.preamble.id == obj_id:
                return obj.preamble.name.rsplit(".", 1)[-1]
        raise P4InfoError(f"P4Info has no {kind[:-1]} with id {obj_id}", kind, str(obj_id))

    def has(self, kind: str, name: str) -> bool:
        return name in self._by[kind]

    @staticmethod
    def encode(value, width: int, what: str, kind: str, name: str) -> bytes:
        """`value` as the canonical bytestring of a bit<`width`> field (spina.p4runtime);
        P4InfoError naming the field (`what`) when it does not fit or is no value."""
        try:
            return encode(value, width)
        except ValueError as e:
            raise P4InfoError(f"{what}: {e}", kind, name) from None

    # ------------------------------------------------------------ builders
    def table_entry(self, table: str, key: dict, action: str | None = None,
                    params: dict | None = None, default: bool = False):
        """A TableEntry by names; `key` {field name: value} ('a.b.c.d/len' for LPM)."""
        t = self.get("tables", table)
        e = pb.TableEntry(table_id=t.preamble.id, is_default_action=default)
        fields = {m.name: m for m in t.match_fields}
        unknown = sorted(set(key) - set(fields))
        if unknown:
            raise P4InfoError(f"table {table!r} has no key field {unknown[0]!r} (its keys: "
                              f"{known_names(unknown[0], fields)})", "tables", table)
        for f in t.match_fields:  # in P4Info order: the entry's bytes are deterministic
            if f.name not in key:
                continue
            v = key[f.name]
            what = f"table {table!r} key {f.name!r}"
            m = e.match.add(field_id=f.id)
            if f.match_type == f.LPM:
                try:
                    net = ipaddress.IPv4Network(v, strict=False)
                except ValueError as err:
                    raise P4InfoError(f"{what}: {err}", "tables", table) from None
                if net.prefixlen == 0:  # LPM don't-care: the field is omitted
                    del e.match[-1]
                    continue
                m.lpm.value = self.encode(int(net.network_address), f.bitwidth, what,
                                          "tables", table)
                m.lpm.prefix_len = net.prefixlen
            elif f.match_type == f.EXACT:
                m.exact.value = self.encode(v, f.bitwidth, what, "tables", table)
            else:
                raise P4InfoError(f"{what}: match type {f.match_type} not supported",
                                  "tables", table)
        if action is not None:
            a = self.get("actions", action)
            e.action.action.action_id = a.preamble.id
            params = dict(params or {})
            names = [p.name for p in a.params]
            for p in a.params:
                if p.name not in params:
                    raise P4InfoError(f"action {action!r} needs parameter {p.name!r} (its "
                                      f"parameters: {known_names(p.name, names)})",
                                      "actions", action)
                e.action.action.params.add(param_id=p.id, value=self.encode(
                    params.pop(p.name), p.bitwidth, f"action {action!r} parameter {p.name!r}",
                    "actions", action))
            if params:
                extra = sorted(params)[0]
                raise P4InfoError(f"action {action!r} has no parameter {extra!r} (its "
                                  f"parameters: {known_names(extra, names)})", "actions", action)
        return e


def election_id(value: int):
    return pb.Uint128(high=value >> 64, low=value & ((1 << 64) - 1))


# ---------------------------------------------------------------- connection
def _tcp_address(address: str) -> tuple[str, int] | None:
    """'host:port' or '[v6]:port' -> (host, port); None for other gRPC targets (unix:...)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address or address.startswith("unix:"):
        return None
    return host.strip("[]"), int(port)


def refused(address: str, timeout: float) -> str | None:
    """Why a TCP connection to `address` failed at once (refused, no route), or None: it was
    accepted, or got no answer within `timeout` (a slow network: gRPC waits longer)."""
    hp = _tcp_address(address)
    if hp is None:
        return None
    try:
        socket.create_connection(hp, timeout=timeout).close()
    except socket.timeout:
        return None
    except OSError as e:
        return e.strerror or str(e)
    return None


def wait_listening(address: str, timeout: float = 30.0) -> None:
    """Wait until a server accepts TCP connections at `address`: for callers that start a
    P4Runtime server (simple_switch_grpc) and connect at once, since a Connection to a port
    nobody listens on fails within a second. P4RuntimeError naming the address after
    `timeout` s."""
    deadline = time.monotonic() + timeout
    while (why := refused(address, 1.0)) is not None:
        if time.monotonic() >= deadline:
            raise P4RuntimeError(f"no P4Runtime server listening at {address} within "
                                 f"{timeout:g} s ({why})")
        time.sleep(0.05)


class Connection:
    """One P4Runtime session with one device: a StreamChannel holding our election id.

    Args:
        address: 'host:port' of the P4Runtime server.
        device_id: the device to control.
        election_id: ours; the highest among connected controllers is primary. None: a
            read-only session (status, doctor, metrics): no StreamChannel and no arbitration,
            which P4Runtime reads do not need, so it never contests or takes primary from a
            running controller; writes are refused.
        timeout: seconds to wait for the server and for arbitration. A refused connection
            (a stopped switch: nothing listens on the port) fails at once instead; a caller that
            has just started the server waits for its port first (`wait_listening`).
        rpc_timeout: seconds any one call may take: a switch that stops answering fails the
            call (DEADLINE_EXCEEDED) instead of holding its caller, and `serve`'s locks, forever.
        channel: a gRPC channel to use instead of opening one to `address`.
        stub: answers the calls instead of gRPC (`in_process`: a LocalStub).
    """

    def __init__(self, address: str, device_id: int = 0, election: int | None = 1,
                 timeout: float = 10.0, channel=None, stub=None, rpc_timeout: float = 60.0):
        self.address = address
        self.rpc_timeout = rpc_timeout
        self.device_id = device_id
        self.election = election
        self._out: queue.Queue = queue.Queue()
        self._arb: queue.Queue = queue.Queue()
        self.primary_election: int | None = None
        self.is_primary = False
        self.index: P4InfoIndex | None = None
        self.stream_lost: str | None = None  # why our StreamChannel ended, if it did
        if stub is not None:  # in-process (LocalStub): no channel to wait for
            self.channel, self.stub = None, stub
        else:
            why = refused(address, min(timeout, 1.0)) if channel is None else None
            if why is not None:  # gRPC would retry with backoff until `timeout`
                raise P4RuntimeError(f"no P4Runtime server at {address}: {why} (is the switch "
                                     "running?)")
            self.channel = channel or grpc.insecure_channel(address)
            self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
            try:
                grpc.channel_ready_future(self.channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                self.channel.close()
                raise P4RuntimeError(f"no P4Runtime server at {address} within {timeout:g} s") \
                    from None
        self._stream = self._reader = None
        if election is None:
            return  # read-only: no stream, no arbitration
        self._stream = self.stub.StreamChannel(iter(self._out.get, None))
        self._reader = threading.Thread(target=self._read_stream, daemon=True,
                                        name=f"p4rt-{address}")
        self._reader.start()
        self._out.put(pb.StreamMessageRequest(arbitration=pb.MasterArbitrationUpdate(
            device_id=device_id, election_id=election_id(election))))
        self._wait_arbitration(timeout)

    def _read_stream(self):
        self.stream_lost = read_stream(self._stream, {"arbitration": self._arb}, self._arb)

    def _wait_arbitration(self, timeout: float) -> None:
        try:
            a = self._arb.get(timeout=timeout)
        except queue.Empty:
            raise P4RuntimeError(f"{self.address}: no arbitration answer within {timeout:g} s") \
                from None
        if isinstance(a, grpc.RpcError):
            if a.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # P4Runtime's answer to an election id another client holds (we use no roles):
                # another controller is here, as when primary is taken (exit 3, README)
                raise NotPrimaryError(
                    f"{self.address}: election id {self.election} is held by another "
                    f"controller of this switch (a running `serve` or `deploy --watch`?): "
                    f"{a.details()}; stop it, or pass another --election-id (the highest "
                    "connected one writes)", a.code())
            raise P4RuntimeError(f"{self.address}: arbitration: {a.code().name}: {a.details()}",
                                 a.code())
        self._apply_arbitration(a)

    def _apply_arbitration(self, a) -> None:
        self.primary_election = a.election_id.high << 64 | a.election_id.low
        self.is_primary = a.status.code == code_pb2.OK

    def refresh_arbitration(self) -> None:
        """Take in arbitration updates the server sent since (the primary may have changed)."""
        while True:
            try:
                a = self._arb.get_nowait()
            except queue.Empty:
                return
            if not isinstance(a, grpc.RpcError):
                self._apply_arbitration(a)

    def require_primary(self) -> None:
        """Raise NotPrimaryError, saying so, unless we are the primary controller."""
        if self.election is None:
            raise NotPrimaryError(f"{self.address}: a read-only session (no election id) "
                                  "writes nothing")
        self.refresh_arbitration()
        if self.stream_lost is not None:
            raise P4RuntimeError(f"{self.address}: our StreamChannel ended ({self.stream_lost}; "
                                 "did the switch restart?): reconnect to write")
        if not self.is_primary:
            raise NotPrimaryError(
                f"{self.address} device {self.device_id}: another controller is primary "
                f"(election id {self.primary_election} > ours {self.election}); refusing to write")

    @classmethod
    def in_process(cls, servicer, device_id: int = 0, election: int | None = 1,
                   timeout: float = 10.0) -> "Connection":
        """A connection to a P4Runtime servicer object in this process (the software switch's
        `SoftSwitchServicer`): the same requests, arbitration and errors, without gRPC."""
        return cls(f"in-process {type(servicer).__name__}", device_id, election, timeout,
                   stub=LocalStub(servicer))

    def close(self) -> None:
        self._out.put(None)
        if self._stream is not None:
            self._stream.cancel()  # gRPC: a no-op once the call has ended
        if self.channel is not None:
            self.channel.close()
        if self._reader is not None:
            self._reader.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ RPCs
    def capabilities(self) -> str:
        return rpc("Capabilities", self.stub.Capabilities, pb.CapabilitiesRequest(),
                    timeout=self.rpc_timeout).p4runtime_api_version

    def get_pipeline(self):
        """The device's ForwardingPipelineConfig (P4Info and cookie), or None if it has none."""
        req = pb.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=pb.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE)
        try:
            return self.stub.GetForwardingPipelineConfig(req, timeout=self.rpc_timeout).config
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                            grpc.StatusCode.UNKNOWN):
                return None
            raise P4RuntimeError(f"GetForwardingPipelineConfig: {e.code().name}: {e.details()}",
                                 e.code()) from None

    def set_pipeline(self, p4info, device_config: bytes, cookie: int) -> None:
        self.require_primary()
        req = pb.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=election_id(self.election),
            action=pb.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        req.config.p4info.CopyFrom(p4info)
        req.config.p4_device_config = device_config
        req.config.cookie.cookie = cookie
        rpc("SetForwardingPipelineConfig", self.stub.SetForwardingPipelineConfig, req,
             timeout=self.rpc_timeout)
        self.index = P4InfoIndex(p4info)

    def use_pipeline(self, p4info) -> None:
        self.index = P4InfoIndex(p4info)

    def write(self, updates: list) -> None:
        """One WriteRequest with `updates` ([(Update.Type, Entity)]); nothing if empty."""
        if not updates:
            return
        self.require_primary()
        req = pb.WriteRequest(device_id=self.device_id, election_id=election_id(self.election))
        for kind, ent in updates:
            u = req.updates.add(type=kind)
            u.entity.CopyFrom(ent)
        rpc("Write", self.stub.Write, req, timeout=self.rpc_timeout)

    def read(self, entities: list) -> list:
        """Every entity the device returns for the `entities` queried."""
        req = pb.ReadRequest(device_id=self.device_id)
        req.entities.extend(entities)

        def run():
            return [e for resp in self.stub.Read(req, timeout=self.rpc_timeout)
                    for e in resp.entities]
        return rpc("Read", run)

    # ------------------------------------------------------------ helpers by name
    def read_table(self, table: str) -> list:
        q = pb.Entity(table_entry=pb.TableEntry(table_id=self.index.id("tables", table)))
        return [e.table_entry for e in self.read([q])]

    def read_counters(self, name: str, indices) -> dict[int, int]:
        cid = self.index.id("counters", name)
        qs = []
        for i in indices:
            e = pb.Entity()
            e.counter_entry.counter_id = cid
            e.counter_entry.index.index = i
            qs.append(e)
        return {e.counter_entry.index.index: e.counter_entry.data.packet_count
                for e in self.read(qs)} if qs else {}

    def read_groups(self) -> list:
        q = pb.Entity(packet_replication_engine_entry=pb.PacketReplicationEngineEntry(
            multicast_group_entry=pb.MulticastGroupEntry(multicast_group_id=0)))
        return [e.packet_replication_engine_entry.multicast_group_entry for e in self.read([q])]


# ---------------------------------------------------------------- in-process
class LocalRpcError(grpc.RpcError):
    """What a servicer's `context.abort(code, details)` raises in process: a grpc.RpcError
    with the same code() and details() a gRPC client would see."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _LocalContext:
    """The part of grpc.ServicerContext a P4Runtime servicer uses."""

    def __init__(self):
        self._callbacks: list = []

    def abort(self, code, details):
        raise LocalRpcError(code, details)

    def add_callback(self, callback) -> bool:
        self._callbacks.append(callback)
        return True

    def cancel(self) -> None:
        """The client ended the call: run the servicer's callbacks, as gRPC does."""
        callbacks, self._callbacks = self._callbacks, []
        for f in callbacks:
            f()


class _LocalStream:
    """A StreamChannel call on a servicer: iterate for its responses, `cancel()` to end it."""

    def __init__(self, servicer, requests):
        self._ctx = _LocalContext()
        self._responses = servicer.StreamChannel(requests, self._ctx)

    def __iter__(self):
        return iter(self._responses)

    def cancel(self) -> None:
        self._ctx.cancel()


class LocalStub:
    """P4RuntimeStub's methods answered by a P4RuntimeServicer object in this process.

    Any object with the servicer's methods will do (duck-typed: the controller imports no
    switch). Requests and responses are the same protobuf messages gRPC would carry; a call's
    `timeout` is taken and ignored (no network in between to hang on)."""

    def __init__(self, servicer):
        self.servicer = servicer

    def Capabilities(self, request, timeout=None):
        return self.servicer.Capabilities(request, _LocalContext())

    def GetForwardingPipelineConfig(self, request, timeout=None):
        return self.servicer.GetForwardingPipelineConfig(request, _LocalContext())

    def SetForwardingPipelineConfig(self, request, timeout=None):
        return self.servicer.SetForwardingPipelineConfig(request, _LocalContext())

    def Write(self, request, timeout=None):
        return self.servicer.Write(request, _LocalContext())

    def Read(self, request, timeout=None):
        return self.servicer.Read(request, _LocalContext())

    def StreamChannel(self, requests):
        return _LocalStream(self.servicer, requests)
