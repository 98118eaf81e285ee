"""P4Runtime (gRPC) in front of the software switch, so the controller drives it with the same
calls as BMv2 and Tofino (P4Runtime spec v1.4: https://p4.org/p4-spec/p4runtime/).

The server writes a `softswitch.dataplane.Dataplane`: the one state of a software switch, which
the L2 mode switches frames with and the UDP mode (softswitch.udp.UdpSwitch.dataplane) serves
its socket from, so one server serves both and every row it accepts is one the data path reads.

Implemented:
  SetForwardingPipelineConfig  VERIFY, VERIFY_AND_COMMIT, RECONCILE_AND_COMMIT (keeps the
                               state), COMMIT (of the running pipeline: a no-op);
                               VERIFY_AND_SAVE commits at once (no staged config). The P4Info
                               must declare every table (with its keys), action (with its
                               parameters), counter and register of spina/spec.py; otherwise
                               INVALID_ARGUMENT naming what is missing.
                               IDs are taken from the P4Info pushed (p4c's or spec.p4info()'s).
                               A committed pipeline starts with empty tables, zero registers and
                               counters, as on a real switch.
  GetForwardingPipelineConfig  P4Info, cookie, device config.
  Write                        table entries (INSERT / MODIFY / DELETE, default action MODIFY),
                               multicast groups (packet replication engine), register entries
                               (MODIFY; an unset index writes every cell), counter entries (MODIFY).
                               Updates apply in order; the first failing one ends the batch with its
                               status (earlier updates stay applied).
  Read                         table entries, counter entries, multicast groups, register entries;
                               wildcards (id 0, unset index, empty match) as in the spec.
  StreamChannel                master arbitration per device (default role only): the highest
                               election id among open streams is primary; every stream is told
                               when that changes. Packet-in/out are not implemented.
  Capabilities                 the P4Runtime API version.

Writes (and pipeline pushes) need the caller's election id to equal the primary's: otherwise
PERMISSION_DENIED. The server binds loopback only unless told otherwise by the caller.
"""
from __future__ import annotations

import ipaddress
import logging
import queue
import threading
from concurrent import futures

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as pb, p4runtime_pb2_grpc

from softswitch.dataplane import Dataplane
from spina import spec
from spina.net import check_tcp_free
from spina.p4runtime import P4RuntimeError, canonical_entry, decode, encode, match_key

log = logging.getLogger("spina.softswitch.p4runtime")

API_VERSION = "1.4.1"
DEFAULT_ADDR = "127.0.0.1:9559"
_READ_CHUNK = 1024  # entities per ReadResponse: a wildcard counter read has 65536 cells


def _fits(v: int, width: int, what: str) -> int:
    if v >> width:
        raise P4RuntimeError(f"{what}: value {v} does not fit in {width} bits",
                             grpc.StatusCode.INVALID_ARGUMENT)
    return v


def missing_from(p4info) -> list[str]:
    """What the software switch implements that `p4info` lacks, as readable names."""
    tables = {t.preamble.name: t for t in p4info.tables}
    actions = {a.preamble.name: a for a in p4info.actions}
    counters = {c.preamble.name for c in p4info.counters}
    registers = {r.preamble.name for r in p4info.registers}
    out = []
    for t in spec.TABLES.values():
        got = tables.get(t.name)
        if got is None:
            out.append(f"table {t.name}")
            continue
        have = {m.name for m in got.match_fields}
        out += [f"key {t.name}.{k.name}" for k in t.keys if k.name not in have]
    for a in spec.ACTIONS.values():
        got = actions.get(a.name)
        if got is None:
            out.append(f"action {a.name}")
            continue
        have = {p.name for p in got.params}
        out += [f"parameter {a.name}({p})" for p, _ in a.params if p not in have]
    out += [f"counter {c}" for c in spec.COUNTERS if c not in counters]
    out += [f"register {r}" for r in spec.p4_register_names() if r not in registers]
    out += [f"register {r.name}" for r in spec.JOB_REGISTERS + spec.SPRAY_REGISTERS
            if r.name not in registers]
    return out


class _Pipeline:
    """The committed P4Info, indexed for decoding requests by ID."""

    def __init__(self, config):
        self.config = config
        info = config.p4info
        self.tables = {t.preamble.id: t for t in info.tables if t.preamble.name in spec.TABLES}
        self.actions = {a.preamble.id: a for a in info.actions}
        self.action_ids = {a.preamble.name: a.preamble.id for a in info.actions}
        self.counters = {c.preamble.id: c for c in info.counters
                         if c.preamble.name in spec.COUNTERS}
        self.registers = {r.preamble.id: r for r in info.registers}
        self.cookie = config.cookie.cookie if config.HasField("cookie") else 0


class SoftSwitchServicer(p4runtime_pb2_grpc.P4RuntimeServicer):
    """The P4Runtime service over one Dataplane.

    Args:
        dataplane: the switch state to program.
        device_id: the P4Runtime device id this switch answers to.
    """

    def __init__(self, dataplane: Dataplane, device_id: int = 0):
        self.dp = dataplane
        self.device_id = device_id
        self.pipe: _Pipeline | None = None
        self.lock = threading.RLock()
        # table name -> {match key (bytes): TableEntry as written}; defaults by table name.
        self.entries: dict[str, dict[bytes, object]] = {}
        self.defaults: dict[str, object] = {}
        self.groups: dict[int, object] = {}
        # Arbitration: stream id -> (election id as int, response queue).
        self.streams: dict[int, tuple[int, queue.Queue]] = {}
        self._next_stream = 0
        self._primary: int | None = None

    # ------------------------------------------------------------ arbitration
    def primary_election_id(self) -> int | None:
        """The election id of the primary client, or None when no client holds one."""
        with self.lock:
            return max((e for e, _ in self.streams.values()), default=None)

    def _arbitration_update(self, election: int, q: queue.Queue) -> None:
        primary = self.primary_election_id()
        msg = pb.StreamMessageResponse()
        arb = msg.arbitration
        arb.device_id = self.device_id
        arb.election_id.high, arb.election_id.low = primary >> 64, primary & ((1 << 64) - 1)
        if election == primary:
            arb.status.code = code_pb2.OK
            arb.status.message = "is primary"
        else:
            arb.status.code = code_pb2.ALREADY_EXISTS
            arb.status.message = "is not primary"
        q.put(msg)

    def _notify_if_primary_changed(self, skip: int | None = None) -> None:
        """Tell every stream (but `skip`, just answered) when the primary changed."""
        now = self.primary_election_id()
        if now != self._primary:
            self._primary = now
            for s, (e, q) in list(self.streams.items()):
                if s != skip:
                    self._arbitration_update(e, q)

    def StreamChannel(self, request_iterator, context):
        q: queue.Queue = queue.Queue()
        with self.lock:
            sid = self._next_stream
            self._next_stream += 1

        def reader():
            try:
                for req in request_iterator:
                    if not req.HasField("arbitration"):
                        continue  # packet-out, digest acks: not implemented
                    a = req.arbitration
                    if a.device_id != self.device_id:
                        q.put(P4RuntimeError(f"no device {a.device_id} (this is {self.device_id})",
                                             grpc.StatusCode.NOT_FOUND))
                        return
                    if a.role.name:
                        q.put(P4RuntimeError("roles are not supported: use the default role",
                                             grpc.StatusCode.UNIMPLEMENTED))
                        return
                    election = a.election_id.high << 64 | a.election_id.low
                    with self.lock:
                        taken = [e for s, (e, _) in self.streams.items() if s != sid]
                        if election in taken:
                            q.put(P4RuntimeError(f"election id {election} is in use by another "
                                                 "client",
                                                 grpc.StatusCode.INVALID_ARGUMENT))
                            return
                        self.streams[sid] = (election, q)
                        self._arbitration_update(election, q)
                        self._notify_if_primary_changed(skip=sid)
            except Exception:  # the client went away
                pass
            # The client closed its side (or went away): end the stream, as BMv2 does; clients
            # (p4runtime-shell's teardown) wait for that.
            q.put(None)

        threading.Thread(target=reader, name="p4rt-stream", daemon=True).start()
        context.add_callback(lambda: q.put(None))  # the RPC ended: cancelled or closed
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, P4RuntimeError):
                    context.abort(item.code, str(item))
                yield item
        finally:
            with self.lock:
                self.streams.pop(sid, None)
                self._notify_if_primary_changed()

    def _check_writer(self, device_id: int, election_id) -> None:
        if device_id != self.device_id:
            raise P4RuntimeError(f"no device {device_id} (this is {self.device_id})",
                                 grpc.StatusCode.NOT_FOUND)
        election = election_id.high << 64 | election_id.low
        primary = self.primary_election_id()
        if primary is None or election != primary:
            raise P4RuntimeError(
                f"election id {election} is not the primary's "
                f"({'no primary' if primary is None else primary}): open a StreamChannel and "
                "win arbitration first",
                grpc.StatusCode.PERMISSION_DENIED)

    # ------------------------------------------------------------ pipeline
    def SetForwardingPipelineConfig(self, request, context):
        try:
            with self.lock, self.dp.pipeline.lock:
                self._check_writer(request.device_id, request.election_id)
                A = pb.SetForwardingPipelineConfigRequest
                if request.action == A.UNSPECIFIED:
                    raise P4RuntimeError("action unspecified", grpc.StatusCode.INVALID_ARGUMENT)
                if request.action == A.COMMIT:
                    if self.pipe is None:
                        raise P4RuntimeError("COMMIT without a saved pipeline",
                                             grpc.StatusCode.FAILED_PRECONDITION)
                    return pb.SetForwardingPipelineConfigResponse()
                missing = missing_from(request.config.p4info)
                if missing:
                    raise P4RuntimeError(
                        "P4Info lacks what the software switch implements: " + ", ".join(missing),
                        grpc.StatusCode.INVALID_ARGUMENT)
                if request.action == A.VERIFY:
                    return pb.SetForwardingPipelineConfigResponse()
                self.pipe = _Pipeline(request.config)
                if request.action != A.RECONCILE_AND_COMMIT:
                    self._reset_state()
                log.info("pipeline committed (cookie %d)", self.pipe.cookie)
            return pb.SetForwardingPipelineConfigResponse()
        except P4RuntimeError as e:
            context.abort(e.code, str(e))

    def _reset_state(self) -> None:
        """A newly committed pipeline starts empty, as on a real switch."""
        dp = self.dp
        dp.ina_endpoint.clear()
        dp.l2.clear()
        dp.l2_spray.clear()
        dp.spray_ports.clear()
        dp.ipv4_routes.clear()
        dp.mcast_groups.clear()
        dp.worker_rewrite.clear()
        dp.pipeline.admission.clear()
        dp.congestion.table.clear()
        dp.roles.clear()  # job_level, leaf_upstream (softswitch/fabric.py)
        for arr in (list(dp.pipeline.registers.values()) + list(dp.pipeline.job_registers.values())
                    + list(dp.spray_registers.values()) + list(dp.pipeline.counters.values())):
            arr[...] = 0
        self.entries = {name: {} for name in spec.TABLES}
        self.defaults = {}
        self.groups = {}
        dp.version += 1

    def GetForwardingPipelineConfig(self, request, context):
        with self.lock:
            if request.device_id != self.device_id:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no device {request.device_id}")
            if self.pipe is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no pipeline committed yet")
            R = pb.GetForwardingPipelineConfigRequest
            resp = pb.GetForwardingPipelineConfigResponse()
            cfg = self.pipe.config
            if request.response_type in (R.ALL, R.P4INFO_AND_COOKIE):
                resp.config.p4info.CopyFrom(cfg.p4info)
            if request.response_type in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
                resp.config.p4_device_config = cfg.p4_device_config
            if cfg.HasField("cookie"):
                resp.config.cookie.CopyFrom(cfg.cookie)
            return resp

    def Capabilities(self, request, context):
        return pb.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ------------------------------------------------------------ write
    def Write(self, request, context):
        try:
            with self.lock, self.dp.pipeline.lock:  # atomic to the data path
                self._check_writer(request.device_id, request.election_id)
                if self.pipe is None:
                    raise P4RuntimeError("no pipeline: SetForwardingPipelineConfig first",
                                         grpc.StatusCode.FAILED_PRECONDITION)
                try:
                    for i, up in enumerate(request.updates):
                        try:
                            self._apply(up)
                        except P4RuntimeError as e:
                            raise P4RuntimeError(f"update {i}: {e}", e.code) from None
                finally:
                    self.dp.version += 1  # whatever applied: the UDP mode derives again
            return pb.WriteResponse()
        except P4RuntimeError as e:
            context.abort(e.code, str(e))

    def _apply(self, up) -> None:
        which = up.entity.WhichOneof("entity")
        if which == "table_entry":
            self._write_table(up.type, up.entity.table_entry)
        elif which == "packet_replication_engine_entry":
            pre = up.entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise P4RuntimeError("only multicast groups in the packet replication engine",
                                     grpc.StatusCode.UNIMPLEMENTED)
            self._write_group(up.type, pre.multicast_group_entry)
        elif which == "register_entry":
            if up.type != pb.Update.MODIFY:
                raise P4RuntimeError("register entries take MODIFY only",
                                     grpc.StatusCode.INVALID_ARGUMENT)
            self._write_register(up.entity.register_entry)
        elif which == "counter_entry":
            if up.type != pb.Update.MODIFY:
                raise P4RuntimeError("counter entries take MODIFY only",
                                     grpc.StatusCode.INVALID_ARGUMENT)
            self._write_counter(up.entity.counter_entry)
        else:
            raise P4RuntimeError(f"{which} is not implemented", grpc.StatusCode.UNIMPLEMENTED)

    # tables -----------------------------------------------------
    def _table(self, table_id: int):
        t = self.pipe.tables.get(table_id)
        if t is None:
            raise P4RuntimeError(f"no table with id {table_id}", grpc.StatusCode.NOT_FOUND)
        return t, spec.TABLES[t.preamble.name]

    def _decode_match(self, info, st, entry) -> dict:
        """{key name: value} in the form Dataplane.table_add takes; checks widths and fields."""
        by_id = {m.id: m for m in info.match_fields}
        got = {}
        for m in entry.match:
            f = by_id.get(m.field_id)
            if f is None:
                raise P4RuntimeError(f"table {st.name}: no match field id {m.field_id}",
                                     grpc.StatusCode.INVALID_ARGUMENT)
            kind = m.WhichOneof("field_match_type")
            key = next(k for k in st.keys if k.name == f.name)
            if kind != key.match:
                raise P4RuntimeError(f"table {st.name}: key {f.name} is {key.match}, not {kind}",
                                     grpc.StatusCode.INVALID_ARGUMENT)
            if kind == "exact":
                got[f.name] = _fits(decode(m.exact.value), key.width, f"{st.name}.{f.name}")
            elif kind == "lpm":
                v = _fits(decode(m.lpm.value), key.width, f"{st.name}.{f.name}")
                plen = m.lpm.prefix_len
                if not 0 < plen <= key.width:
                    raise P4RuntimeError(f"{st.name}.{f.name}: prefix_len {plen}",
                                         grpc.StatusCode.INVALID_ARGUMENT)
                got[f.name] = f"{ipaddress.IPv4Address(v)}/{plen}"
            else:
                raise P4RuntimeError(f"{kind} match", grpc.StatusCode.UNIMPLEMENTED)
        for k in st.keys:  # an omitted LPM field is the wildcard: prefix length 0
            if k.match == "lpm" and k.name not in got:
                got[k.name] = "0.0.0.0/0"
        need = {k.name for k in st.keys}
        if set(got) != need and not (entry.is_default_action and not entry.match):
            raise P4RuntimeError(f"table {st.name}: needs keys {sorted(need)}, got {sorted(got)}",
                                 grpc.StatusCode.INVALID_ARGUMENT)
        return got

    def _decode_action(self, st, entry) -> tuple[str, dict]:
        if entry.action.WhichOneof("type") != "action":
            raise P4RuntimeError(f"table {st.name}: a direct action is required",
                                 grpc.StatusCode.INVALID_ARGUMENT)
        act = entry.action.action
        info = self.pipe.actions.get(act.action_id)
        if info is None:
            raise P4RuntimeError(f"no action with id {act.action_id}", grpc.StatusCode.NOT_FOUND)
        name = info.preamble.name
        if name not in st.actions:
            raise P4RuntimeError(f"table {st.name} has no action {name}",
                                 grpc.StatusCode.INVALID_ARGUMENT)
        by_id = {p.id: p for p in info.params}
        params = {}
        for p in act.params:
            pi = by_id.get(p.param_id)
            if pi is None:
                raise P4RuntimeError(f"action {name}: no parameter id {p.param_id}",
                                     grpc.StatusCode.INVALID_ARGUMENT)
            params[pi.name] = _fits(decode(p.value), pi.bitwidth, f"{name}({pi.name})")
        return name, params

    def _write_table(self, kind, entry) -> None:
        info, st = self._table(entry.table_id)
        key = self._decode_match(info, st, entry)
        entries = self.entries.setdefault(st.name, {})
        if entry.is_default_action:
            if kind != pb.Update.MODIFY:
                raise P4RuntimeError(f"table {st.name}: the default action takes MODIFY only",
                                     grpc.StatusCode.INVALID_ARGUMENT)
            if entry.action.WhichOneof("type") is None:  # reset to the P4 default
                self.defaults.pop(st.name, None)
                return
            action, params = self._decode_action(st, entry)
            if action != st.default or params:
                raise P4RuntimeError(f"table {st.name}: default action is fixed to {st.default}",
                                     grpc.StatusCode.PERMISSION_DENIED)
            self.defaults[st.name] = canonical_entry(entry)
            return
        mk = match_key(entry)
        exists = mk in entries
        if kind == pb.Update.INSERT and exists:
            raise P4RuntimeError(f"table {st.name}: entry exists", grpc.StatusCode.ALREADY_EXISTS)
        if kind in (pb.Update.MODIFY, pb.Update.DELETE) and not exists:
            raise P4RuntimeError(f"table {st.name}: no such entry", grpc.StatusCode.NOT_FOUND)
        if kind == pb.Update.DELETE:
            self.dp.table_delete(st.name, key)
            del entries[mk]
            return
        if kind not in (pb.Update.INSERT, pb.Update.MODIFY):
            raise P4RuntimeError("update type unspecified", grpc.StatusCode.INVALID_ARGUMENT)
        action, params = self._decode_action(st, entry)
        if not exists and len(entries) >= st.size:
            raise P4RuntimeError(f"table {st.name} is full ({st.size} entries)",
                                 grpc.StatusCode.RESOURCE_EXHAUSTED)
        try:
            self.dp.table_add(st.name, key, action, params)
        except (KeyError, ValueError) as e:
            raise P4RuntimeError(f"table {st.name}: {e}",
                                 grpc.StatusCode.INVALID_ARGUMENT) from None
        entries[mk] = canonical_entry(entry)

    # multicast ----------------------------------------------------
    def _write_group(self, kind, g) -> None:
        gid = g.multicast_group_id
        if gid == 0:
            raise P4RuntimeError("multicast group id 0", grpc.StatusCode.INVALID_ARGUMENT)
        exists = gid in self.groups
        if kind == pb.Update.INSERT and exists:
            raise P4RuntimeError(f"multicast group {gid} exists", grpc.StatusCode.ALREADY_EXISTS)
        if kind in (pb.Update.MODIFY, pb.Update.DELETE) and not exists:
            raise P4RuntimeError(f"no multicast group {gid}", grpc.StatusCode.NOT_FOUND)
        if kind == pb.Update.DELETE:
            self.dp.mcast_group_set(gid, [])
            del self.groups[gid]
            return
        replicas = [(r.egress_port, r.instance) for r in g.replicas]
        if len(set(replicas)) != len(replicas):
            raise P4RuntimeError(f"multicast group {gid}: duplicate replica",
                                 grpc.StatusCode.INVALID_ARGUMENT)
        self.dp.mcast_group_set(gid, replicas)
        self.groups[gid] = type(g)()
        self.groups[gid].CopyFrom(g)

    # registers -----------------------------------------------------
    def _register_cells(self, reg_id: int, index):
        """(P4 name, numpy array, column or None, width, indices) of a register entry."""
        info = self.pipe.registers.get(reg_id)
        if info is None:
            raise P4RuntimeError(f"no register with id {reg_id}", grpc.StatusCode.NOT_FOUND)
        name = info.preamble.name
        job_reg = {r.name: r for r in spec.JOB_REGISTERS}.get(name)
        spray_reg = {r.name: r for r in spec.SPRAY_REGISTERS}.get(name)
        if job_reg is not None:  # one cell per job id
            base, lane, elem, reg = name, None, None, job_reg
            arr = self.dp.pipeline.job_registers[name]
        elif spray_reg is not None:  # one cell per spray group (forwarding.p4)
            base, lane, elem, reg = name, None, None, spray_reg
            arr = self.dp.spray_registers[name]
        else:
            base, lane, elem = spec.split_p4_register(name)
            reg = {r.name: r for r in spec.REGISTERS}.get(base)
            if reg is None:
                raise P4RuntimeError(f"register {name} is not implemented by the software switch",
                                     grpc.StatusCode.NOT_FOUND)
            arr = self.dp.pipeline.registers[base]
        col = None
        if reg.shape == spec.LANE:
            col = lane
        elif reg.shape == spec.VALUE:
            col = lane * spec.P4_SIZES["BLOCK_SIZE"] + elem  # the P4-sized view (l2.register)
        size = min(info.size or arr.shape[0], arr.shape[0])
        if index is None:
            idx = range(size)
        else:
            if not 0 <= index < size:
                raise P4RuntimeError(f"register {name}: index {index} outside 0..{size - 1}",
                                     grpc.StatusCode.OUT_OF_RANGE)
            idx = [index]
        return name, arr, col, reg.width, idx

    def _write_register(self, r) -> None:
        index = r.index.index if r.HasField("index") else None
        name, arr, col, width, idx = self._register_cells(r.register_id, index)
        if r.data.WhichOneof("data") != "bitstring":
            raise P4RuntimeError(f"register {name}: data must be a bitstring",
                                 grpc.StatusCode.INVALID_ARGUMENT)
        v = _fits(decode(r.data.bitstring), width, f"register {name}")
        if arr.dtype.kind == "i" and v >> (width - 1):  # the P4's bits of a signed array
            v -= 1 << width
        cells = slice(idx.start, idx.stop) if isinstance(idx, range) else idx
        if col is None:
            arr[cells] = v
        elif col < arr.shape[1]:
            arr[cells, col] = v
        elif v:  # an element beyond --slot-capacity: no such cell here, it reads 0
            raise P4RuntimeError(f"register {name}: element {col} is beyond this switch's slot "
                                 f"capacity of {arr.shape[1]}",
                                 grpc.StatusCode.OUT_OF_RANGE)

    def _write_counter(self, c) -> None:
        info = self.pipe.counters.get(c.counter_id)
        if info is None:
            raise P4RuntimeError(f"no counter with id {c.counter_id}", grpc.StatusCode.NOT_FOUND)
        arr = self.dp.pipeline.counters[info.preamble.name]
        if c.HasField("index"):
            arr[c.index.index] = c.data.packet_count
        else:
            arr[:] = c.data.packet_count

    # ------------------------------------------------------------ read
    def Read(self, request, context):
        try:
            with self.lock:
                if request.device_id != self.device_id:
                    raise P4RuntimeError(f"no device {request.device_id}",
                                         grpc.StatusCode.NOT_FOUND)
                if self.pipe is None:
                    raise P4RuntimeError("no pipeline committed yet",
                                         grpc.StatusCode.FAILED_PRECONDITION)
                out = []
                for ent in request.entities:
                    out += self._read(ent)
        except P4RuntimeError as e:
            context.abort(e.code, str(e))
        for i in range(0, max(len(out), 1), _READ_CHUNK):
            resp = pb.ReadResponse()
            resp.entities.extend(out[i:i + _READ_CHUNK])
            yield resp

    def _read(self, ent) -> list:
        which = ent.WhichOneof("entity")
        if which == "table_entry":
            q = ent.table_entry
            ids = [q.table_id] if q.table_id else list(self.pipe.tables)
            out = []
            for tid in ids:
                info, st = self._table(tid)
                if q.is_default_action:
                    d = self.defaults.get(st.name)
                    if d is None:  # the P4 program's default
                        d = pb.TableEntry(table_id=tid, is_default_action=True)
                        d.action.action.action_id = self.pipe.action_ids[st.default]
                    out.append(pb.Entity(table_entry=d))
                    continue
                rows = self.entries.get(st.name, {})
                if q.match:
                    mk = match_key(q)
                    rows = {mk: rows[mk]} if mk in rows else {}
                out += [pb.Entity(table_entry=e) for e in rows.values()]
            return out
        if which == "counter_entry":
            q = ent.counter_entry
            ids = [q.counter_id] if q.counter_id else list(self.pipe.counters)
            out = []
            for cid in ids:
                info = self.pipe.counters.get(cid)
                if info is None:
                    raise P4RuntimeError(f"no counter with id {cid}", grpc.StatusCode.NOT_FOUND)
                arr = self.dp.pipeline.counters[info.preamble.name]
                idx = [q.index.index] if q.HasField("index") else range(len(arr))
                for i in idx:
                    if not 0 <= i < len(arr):
                        raise P4RuntimeError(f"counter {info.preamble.name}: index {i}",
                                             grpc.StatusCode.OUT_OF_RANGE)
                    e = pb.Entity()
                    c = e.counter_entry
                    c.counter_id, c.index.index = cid, i
                    c.data.packet_count = int(arr[i])
                    out.append(e)
            return out
        if which == "packet_replication_engine_entry":
            g = ent.packet_replication_engine_entry.multicast_group_entry
            gids = [g.multicast_group_id] if g.multicast_group_id else sorted(self.groups)
            return [pb.Entity(packet_replication_engine_entry=pb.PacketReplicationEngineEntry(
                multicast_group_entry=self.groups[i])) for i in gids if i in self.groups]
        if which == "register_entry":
            q = ent.register_entry
            ids = [q.register_id] if q.register_id else list(self.pipe.registers)
            # A wildcard read returns every register the P4Info declares that this switch
            # holds: the slot registers, job_loss_credit and spray_turn (as BMv2 does).
            served = (set(spec.REGISTER_NAMES) | {r.name for r in spec.JOB_REGISTERS}
                      | {r.name for r in spec.SPRAY_REGISTERS})
            out = []
            for rid in ids:
                name = self.pipe.registers[rid].preamble.name if rid in self.pipe.registers else ""
                if not q.register_id and name not in served and \
                        spec.split_p4_register(name)[0] not in served:
                    continue
                index = q.index.index if q.HasField("index") else None
                name, arr, col, width, idx = self._register_cells(rid, index)
                for i in idx:
                    v = arr[i] if col is None else arr[i, col] if col < arr.shape[1] else 0
                    e = pb.Entity()
                    r = e.register_entry
                    r.register_id, r.index.index = rid, i
                    r.data.bitstring = encode(int(v) & ((1 << width) - 1), width)
                    out.append(e)
            return out
        raise P4RuntimeError(f"reading {which} is not implemented", grpc.StatusCode.UNIMPLEMENTED)


class P4RuntimeServer:
    """A gRPC server with the P4Runtime service over `dataplane`. `start()`, `stop()`.

    Args:
        dataplane: the software switch state (softswitch.dataplane.Dataplane).
        address: host:port to bind; port 0 picks a free one (see `.address` after start).
        device_id: as SoftSwitchServicer.
        servicer: the servicer to serve (default: a new one over `dataplane`), e.g. the one a
            controller in this process already programmed the switch through.
    """

    def __init__(self, dataplane: Dataplane, address: str = DEFAULT_ADDR, device_id: int = 0,
                 servicer: SoftSwitchServicer | None = None):
        self.servicer = servicer or SoftSwitchServicer(dataplane, device_id)
        # Each open StreamChannel holds a worker thread for its lifetime: room for many.
        # SO_REUSEPORT off: a second switch on a port in use must fail, not share it.
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32,
                                                             thread_name_prefix="p4rt"),
                                  options=[("grpc.so_reuseport", 0)])
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self.servicer, self.server)
        host, _, port = address.rpartition(":")
        if port.isdigit():  # (check_loopback refuses the rest)
            check_tcp_free(host, int(port), "P4Runtime")
        try:
            bound = self.server.add_insecure_port(address)
        except RuntimeError:  # grpcio >= 1.5x raises where older ones returned 0
            bound = 0
        if bound == 0:
            raise OSError(f"cannot serve P4Runtime on {address}: the address is in use or "
                          "not this host's")
        self.address = f"{host}:{bound}"

    def start(self) -> "P4RuntimeServer":
        self.server.start()
        log.info("P4Runtime server on %s (device %d)", self.address, self.servicer.device_id)
        return self

    def stop(self, grace: float = 0.5) -> None:
        self.server.stop(grace).wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def check_loopback(address: str) -> str:
    """`address` if its host is a loopback address (the P4Runtime port has no authentication)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{address!r}: expected HOST:PORT with a TCP port 0..65535 "
                         f"(0: any free), e.g. {DEFAULT_ADDR}")
    h = host.strip("[]")
    if h != "localhost":
        try:
            ok = ipaddress.ip_address(h).is_loopback
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{address!r}: the P4Runtime server binds loopback addresses only "
                             "(it has no authentication)")
    return address
