"""The controller's Tofino target over BF Runtime (`api: bfrt`, controller/bfrt.py) without a
Tofino: a fake BF Runtime gRPC server (the SDE's generated BfRuntimeServicer) keeps the tables
of the committed bf-p4c schema (tofino/build/spina_tna.bfrt.json) and the PRE's fixed tables,
refuses ids, key fields and value widths that schema lacks and PRE groups naming nodes that do
not exist (or nodes deleted from a group), records every request and answers reads. The
tests check the pipeline pushed, the exact entries, register cells and counters written for a
job's deploy, a new run, a reset, a removal and a group change, and the refusals of bad input.

Needs the SDE's Python modules (bfruntime_pb2{,_grpc}.py under $SDE_INSTALL/lib/python3.*/
site-packages/tofino/bfrt_grpc; controller/README.md "BF Runtime"): without them the tests
that talk to the fake server skip, saying where they looked.

Run just this file: python -m pytest tests/test_controller_bfrt.py
"""
from __future__ import annotations

import json
import os
import pathlib
import queue
import shutil
import subprocess
import sys
import threading

import grpc
import pytest
import yaml
from google.protobuf import text_format
from google.rpc import status_pb2
from p4.v1 import p4runtime_pb2 as pb

from controller import bfrt, model, state as state_mod, tofino
from controller.controller import Controller
from controller.p4rt import NotPrimaryError, P4RuntimeError
from spina import spec
from spina.config import ConfigError
from spina.p4runtime import decode
from tests.test_controller_tofino import (
    JOB7,
    STD_P4INFO,
    fake_bf_p4c_output,
    test_switch_fields_are_validated as switch_field_refused,
    tofino_doc,
)
from tests.waits import until

ROOT = pathlib.Path(__file__).resolve().parents[1]
BFRT_JSON = ROOT / "tofino" / "build" / "spina_tna.bfrt.json"

try:
    BF, BF_GRPC = bfrt.load_sde_modules()
    NO_SDE = None
except ConfigError as e:
    BF = BF_GRPC = None
    NO_SDE = str(e)
needs_sde = pytest.mark.skipif(BF is None, reason=str(NO_SDE))

# The PRE's fixed tables as the device reports them (names and types as in the SDE's
# bf_rt_pre_tf1.json; ids and field ids of our own, so that only a lookup finds them).
FIXED = json.dumps({"tables": [
    {"name": "$pre.mgid", "id": 901, "table_type": "PreMgid", "size": 65536,
     "key": [{"id": 7, "name": "$MGID", "match_type": "Exact", "type": {"type": "uint16"}}],
     "data": [{"singleton": {"id": i, "name": n, "repeated": True, "type": {"type": t}}}
              for i, n, t in ((11, "$MULTICAST_NODE_ID", "uint32"),
                              (12, "$MULTICAST_NODE_L1_XID_VALID", "bool"),
                              (13, "$MULTICAST_NODE_L1_XID", "uint16"))]},
    {"name": "$pre.node", "id": 902, "table_type": "PreNode", "size": 1 << 20,
     "key": [{"id": 5, "name": "$MULTICAST_NODE_ID", "match_type": "Exact",
              "type": {"type": "uint32"}}],
     "data": [{"singleton": {"id": i, "name": n, "repeated": r, "type": {"type": t}}}
              for i, n, r, t in ((21, "$MULTICAST_RID", False, "uint16"),
                                 (22, "$MULTICAST_LAG_ID", True, "uint8"),
                                 (23, "$DEV_PORT", True, "uint32"))]}]}).encode()
PIPES = 4  # a register read answers one value per pipe


class FakeBfRuntime:
    """A BF Runtime server holding entries by (table id, key): it checks every id, key field
    and value width against the BF-RT JSON it runs (bfrt.json pushed, FIXED), binds one client
    per program, and records each request as (method, request)."""

    def __init__(self, notify: bool = True):
        self.notify = notify  # tell the clients' streams when a push is done
        self.streams: dict[int, queue.Queue] = {}
        self.requests: list = []
        self.config = None
        self.tables: dict[int, dict] = {}
        self.owner: int | None = None
        self.lock = threading.Lock()
        self.schema = bfrt.BfrtSchema(FIXED)

    def calls(self, method: str) -> list:
        return [r for m, r in self.requests if m == method]

    # ------------------------------------------------------------ RPCs
    def StreamChannel(self, request_iterator, context):
        out: queue.Queue = queue.Queue()

        def take():  # the client's messages, while we answer on `out`
            client = None
            try:
                for req in request_iterator:
                    if req.HasField("subscribe"):
                        client, self.streams[req.client_id] = req.client_id, out
                        out.put(BF.StreamMessageResponse(subscribe=BF.Subscribe(
                            device_id=req.subscribe.device_id,
                            status=status_pb2.Status(code=0))))
            except grpc.RpcError:  # the client cancelled its stream
                pass
            with self.lock:  # a client gone releases its program
                if client is not None and self.owner == client:
                    self.owner = None
            out.put(None)
        threading.Thread(target=take, daemon=True).start()
        context.add_callback(lambda: out.put(None))
        yield from iter(out.get, None)

    def SetForwardingPipelineConfig(self, request, context):
        with self.lock:
            self.requests.append(("SetForwardingPipelineConfig", request))
            (cfg,) = request.config
            if request.action == BF.SetForwardingPipelineConfigRequest.BIND:
                if self.config is None or cfg.p4_name != self.config.p4_name:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"no program {cfg.p4_name}")
                if self.owner not in (None, request.client_id):
                    context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Client ID "
                                  f"{request.client_id} trying to bind but Client ID "
                                  f"{self.owner} already owns this P4")
                self.owner = request.client_id
            else:
                self.config, self.tables = cfg, {}
                self.schema = bfrt.BfrtSchema(cfg.bfruntime_info, FIXED)
                done = BF.StreamMessageResponse()
                done.set_forwarding_pipeline_config_response \
                    .set_forwarding_pipeline_config_response_type = \
                    BF.SetForwardingPipelineConfigResponseType.Value("WARM_INIT_FINISHED")
                for stream in self.streams.values() if self.notify else ():
                    stream.put(done)
        return BF.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):
        resp = BF.GetForwardingPipelineConfigResponse()
        if self.config is not None:
            resp.config.add().CopyFrom(self.config)
        resp.non_p4_config.bfruntime_info = FIXED
        return resp

    def _check(self, context, e):
        """The entry's table, key and data fields exist and each value has its whole bytes."""
        t = self.schema.by_id.get(e.table_id)
        if t is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no table id {e.table_id}")
        widths = {i: w for i, w in t.keys.values()}
        for k in e.key.fields:
            v = k.exact.value if k.HasField("exact") else k.lpm.value
            if widths.get(k.field_id, -1) + 7 >> 3 != len(v):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{t.name}: key field {k.field_id}: {len(v)} bytes")
        fields = {i: w for _, i, w in t.data}
        if e.data.action_id:
            acts = {a: p for a, p in t.actions.values()}
            if e.data.action_id not in acts:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{t.name}: no action {e.data.action_id}")
            fields = {i: w for i, w in acts[e.data.action_id].values()}
        for f in e.data.fields:
            ok = f.field_id in fields and (f.WhichOneof("value") != "stream" or
                                           len(f.stream) == fields[f.field_id] + 7 >> 3)
            if not ok:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{t.name}: data field {f.field_id} ({f.WhichOneof('value')})")
        return t

    def _check_pre(self, context, t, kind, e):
        """The PRE's references: a group names only nodes that exist, a node in a group
        cannot go."""
        node, mgid = self.schema.table("$pre.node"), self.schema.table("$pre.mgid")
        members = node.key("$MULTICAST_NODE_ID")[0]
        in_groups = {n for g in self.tables.get(mgid.id, {}).values() for f in g.data.fields
                     if f.field_id == mgid.field("$MULTICAST_NODE_ID")[0]
                     for n in f.int_arr_val.val}
        if t is mgid and kind != BF.Update.DELETE:
            for f in e.data.fields:
                for n in (f.int_arr_val.val if f.field_id == mgid.field("$MULTICAST_NODE_ID")[0]
                          else ()):
                    key = BF.TableEntry()
                    key.key.fields.add(field_id=members).exact.value = n.to_bytes(4, "big")
                    if self.key_of(key) not in self.tables.get(node.id, {}):
                        context.abort(grpc.StatusCode.NOT_FOUND, f"$pre.mgid: no node {n}")
        if t is node and kind == BF.Update.DELETE and \
                decode(e.key.fields[0].exact.value) in in_groups:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "$pre.node: in a group")

    @staticmethod
    def key_of(e) -> bytes:
        return b"".join(k.SerializeToString() for k in sorted(e.key.fields,
                                                              key=lambda k: k.field_id))

    def Write(self, request, context):
        with self.lock:
            self.requests.append(("Write", request))
            if self.owner != request.client_id:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "client not bound")
            for u in request.updates:
                e = u.entity.table_entry
                t = self._check(context, e)
                rows = self.tables.setdefault(e.table_id, {})
                k = self.key_of(e)
                cell = "$REGISTER_INDEX" in t.keys or "$COUNTER_INDEX" in t.keys
                if u.type == BF.Update.INSERT and k in rows:
                    context.abort(grpc.StatusCode.ALREADY_EXISTS, f"{t.name}: entry exists")
                if u.type in (BF.Update.MODIFY, BF.Update.DELETE) and k not in rows \
                        and not cell:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"{t.name}: no such entry")
                self._check_pre(context, t, u.type, e)
                if u.type == BF.Update.DELETE:
                    rows.pop(k, None)
                else:
                    rows[k] = e
        return BF.WriteResponse()

    def Read(self, request, context):
        self.requests.append(("Read", request))
        out = BF.ReadResponse()
        for q in request.entities:
            e = q.table_entry
            t = self._check(context, e)
            rows = self.tables.get(e.table_id, {})
            if not e.key.fields:
                got = list(rows.values())
            else:
                hit = rows.get(self.key_of(e))
                if hit is None:  # a cell never written holds zeros
                    hit = BF.TableEntry(table_id=e.table_id, key=e.key)
                    for _, fid, w in t.data:
                        hit.data.fields.add(field_id=fid, stream=bytes(w + 7 >> 3))
                got = [hit]
            for g in got:
                g = BF.TableEntry.FromString(g.SerializeToString())
                if "$REGISTER_INDEX" in t.keys:  # one value per pipe, pipe 0's first;
                    fields = list(g.data.fields)  # pipe p's differs by p (its own cells)
                    del g.data.fields[:]
                    for pipe in range(PIPES):
                        for f in fields:
                            v = (decode(f.stream) + pipe) % (1 << 8 * len(f.stream))
                            g.data.fields.add(field_id=f.field_id,
                                              stream=v.to_bytes(len(f.stream), "big"))
                out.entities.add().table_entry.CopyFrom(g)
        yield out

    # ------------------------------------------------------------ by name, for the tests
    def put(self, table: str, key: dict, data: dict):
        """Store an entry by BF-RT names (a counter the data plane counted)."""
        t = self.schema.table(table)
        e = BF.TableEntry(table_id=t.id)
        for n, v in key.items():
            fid, w = t.key(n)
            e.key.fields.add(field_id=fid).exact.value = v.to_bytes(w + 7 >> 3, "big")
        for n, v in data.items():
            fid, w = t.field(n)
            e.data.fields.add(field_id=fid, stream=v.to_bytes(w + 7 >> 3, "big"))
        self.tables.setdefault(t.id, {})[self.key_of(e)] = e


def named(server: FakeBfRuntime, e) -> tuple:
    """A BF Runtime entry by names: (table, {key: value}, action, {field: value})."""
    t = server.schema.by_id[e.table_id]
    keys = {i: n for n, (i, _) in t.keys.items()}
    key = {keys[k.field_id]: (decode(k.exact.value) if k.HasField("exact") else
                              (decode(k.lpm.value), k.lpm.prefix_len)) for k in e.key.fields}
    action, names = None, {i: n for n, i, _ in t.data}
    for a, (aid, params) in t.actions.items():
        if aid == e.data.action_id and "." not in a:
            action, names = a, {i: n for n, (i, _) in params.items()}
    data = {}
    for f in e.data.fields:
        kind = f.WhichOneof("value")
        data[names[f.field_id]] = decode(f.stream) if kind == "stream" else \
            tuple(getattr(f, kind).val)
    return t.name, tuple(sorted(key.items())), action, tuple(sorted(data.items()))


@pytest.fixture
def bfrt_server(grpc_servers):
    """A fake BF Runtime server on a free loopback port, stopped afterwards."""
    return lambda **kw: grpc_servers(FakeBfRuntime(**kw), BF_GRPC.add_BfRuntimeServicer_to_server,
                                     8)


def bf_build(tmp_path) -> pathlib.Path:
    """A bf-p4c output directory whose bfrt.json is tofino/build's real one (make tofino)."""
    build = fake_bf_p4c_output(tmp_path / "out")
    shutil.copy(BFRT_JSON, build / "bfrt.json")
    return build


def bfrt_state(tmp_path, address, jobs=(JOB7,)) -> model.DesiredState:
    doc = tofino_doc(address, STD_P4INFO, bf_build(tmp_path), jobs=list(jobs))
    sw = doc["switches"][0]
    del sw["device_config_format"]
    sw["api"] = "bfrt"
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc))
    return state_mod.load(p)


def writes(server, start=0) -> list[list[tuple]]:
    """Each Write since request `start`, as [(update type name, named entry)]."""
    return [[(BF.Update.Type.Name(u.type), named(server, u.entity.table_entry))
             for u in w.updates] for w in server.calls("Write")[start:]]


# Job 7: w0..w2 on ports 1..3, slots 4..5 (copies 8..11), group 8, rids 225..227.
ADMIT = {"epoch": 1, "slot_base": 4, "nslots": 2, "nworkers": 3,
         "block_size": spec.TNA_SIZES["BLOCK_SIZE"], "nlanes": 1, "mcast_grp": 8}


def admission(rank: int, epoch: int = 1) -> tuple:
    key = {"ingress_port": rank + 1, "src_addr": 0x0A000001 + rank,
           "src_port": 50000 + rank, "job": 7, "rank": rank}
    return ("pipe.admission", tuple(sorted(key.items())), "admit",
            tuple(sorted(dict(ADMIT, epoch=epoch).items())))


def slot_clear(server) -> set:
    """The register cells a clear of job 7 writes, by name: every slot register's copies
    8..11 (slot_flags FLAG_LAST, pairs lo and hi zero), slot_rank_round's cells 256..383."""
    out = set()
    for name, _, cells in spec.tna_registers():
        if cells != 2 * spec.TNA_SIZES["POOL_SLOTS"]:
            continue
        t = server.schema.table(name)
        data = tuple(sorted((n, 4 if name == "slot_flags" else 0) for n, _, _ in t.data))
        out |= {("pipe." + name, (("$REGISTER_INDEX", i),), None, data) for i in range(8, 12)}
    out |= {("pipe.slot_rank_round", (("$REGISTER_INDEX", i),), None,
             (("slot_rank_round.f1", 0),)) for i in range(256, 384)}
    return out


@needs_sde
def test_deploy_pushes_the_build_and_writes_the_job(bfrt_server, tmp_path):
    """A first deploy pushes bf-p4c's files, binds, clears job 7's slots, then writes its
    entries and multicast group: exactly these, by the names of bfrt.json."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        (rep,) = c.deploy()
    push, bind = sw.calls("SetForwardingPipelineConfig")
    assert push.action == BF.SetForwardingPipelineConfigRequest.VERIFY_AND_WARM_INIT_BEGIN_AND_END
    (cfg,) = push.config
    build = tofino.load_build(tmp_path / "out")
    assert (cfg.p4_name, cfg.bfruntime_info) == ("spina_tna", BFRT_JSON.read_bytes())
    assert [(p.profile_name, p.context, p.binary, list(p.pipe_scope)) for p in cfg.profiles] \
        == [("pipe", build.profiles[0].context, build.profiles[0].binary, [0, 1, 2, 3])]
    assert (bind.action, [c.p4_name for c in bind.config]) == \
        (BF.SetForwardingPipelineConfigRequest.BIND, ["spina_tna"])
    clear, entries = writes(sw)
    assert {u for u, _ in clear} == {"MODIFY"} and len(clear) == len(slot_clear(sw))
    assert {e for _, e in clear} == slot_clear(sw)
    nodes = [("INSERT", ("$pre.node", (("$MULTICAST_NODE_ID", 8 * 256 + r),), None,
                         (("$DEV_PORT", (r + 1,)), ("$MULTICAST_LAG_ID", ()),
                          ("$MULTICAST_RID", 7 * 32 + r + 1))))
             for r in range(3)]
    group = ("INSERT", ("$pre.mgid", (("$MGID", 8),), None, (
        ("$MULTICAST_NODE_ID", (2048, 2049, 2050)), ("$MULTICAST_NODE_L1_XID", (0, 0, 0)),
        ("$MULTICAST_NODE_L1_XID_VALID", (False, False, False)))))
    rewrite = [("INSERT", ("pipe.worker_rewrite", (("rid", 225 + r),), "rewrite_for_worker",
                           (("dst_addr", 0x0A000001 + r), ("dst_mac", 0x020000000001 + r),
                            ("dst_port", 50000 + r)))) for r in range(3)]
    l2 = [("INSERT", ("pipe.l2", (("dst_mac", 0x020000000001 + r),), "bridge",
                      (("port", r + 1),))) for r in range(4)]
    endpoint = ("INSERT", ("pipe.ina_endpoint", (("dst_addr", 0x0A000064),), "accept_ina", ()))
    # Admission last: a job's rewrites and group exist before its packets are admitted.
    assert entries == l2 + nodes + [group] + rewrite + [endpoint] + \
        [("INSERT", admission(r)) for r in range(3)]
    assert (rep.pipeline_pushed, rep.inserts, rep.cleared) == (True, 12, [(7, 4, 2)])


@needs_sde
def test_the_same_entries_as_over_p4runtime(bfrt_server, fake, tmp_path):
    """Every table entry BF Runtime gets is one the P4Runtime path writes for the same state,
    by name (the P4Info's on one side, bfrt.json's on the other)."""
    sw = bfrt_server()
    with Controller(bfrt_state(tmp_path / "b", sw.address)) as c:
        c.deploy()
    p4 = fake()
    doc = tofino_doc(p4.address, STD_P4INFO, bf_build(tmp_path / "p"), jobs=[JOB7])
    (tmp_path / "p" / "s.yaml").write_text(yaml.safe_dump(doc))
    with Controller(state_mod.load(tmp_path / "p" / "s.yaml")) as c:
        c.deploy()
    info = p4.config.p4info
    tables = {t.preamble.id: t for t in info.tables}
    actions = {a.preamble.id: a for a in info.actions}
    over_p4rt = set()
    for w in p4.calls("Write"):
        for u in w.updates:
            if u.entity.HasField("table_entry"):
                e = u.entity.table_entry
                t, a = tables[e.table_id], actions[e.action.action.action_id]
                fields = {f.id: f.name for f in t.match_fields}
                params = {p.id: p.name for p in a.params}
                over_p4rt.add((
                    "pipe." + t.preamble.name,
                    tuple(sorted((fields[m.field_id], decode(m.exact.value)) for m in e.match)),
                    a.preamble.name,
                    tuple(sorted((params[p.param_id], decode(p.value))
                                 for p in e.action.action.params))))
    over_bfrt = {e for w in writes(sw) for _, e in w if e[0].startswith("pipe.")
                 and e[2] is not None}
    assert over_bfrt == over_p4rt and len(over_bfrt) == 11


@needs_sde
def test_a_second_deploy_writes_nothing_and_a_new_run_clears_the_slots(bfrt_server, tmp_path):
    """The same state again: no push (the switch's content has our cookie), no writes. A new
    run of job 7 (epoch 2): its admission entries modified, then its slots cleared."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        c.deploy()
    n_set, n_write = len(sw.calls("SetForwardingPipelineConfig")), len(sw.calls("Write"))
    with Controller(st) as c:  # a new controller process: it binds, pushes nothing
        (rep,) = c.deploy()
        assert not rep.changed
        assert [r.action for r in sw.calls("SetForwardingPipelineConfig")[n_set:]] == \
            [BF.SetForwardingPipelineConfigRequest.BIND]
        assert len(sw.calls("Write")) == n_write
        c.start_run(7, 2)
    modify, clear = writes(sw, n_write)
    assert modify == [("MODIFY", admission(r, epoch=2)) for r in range(3)]
    assert {e for _, e in clear} == slot_clear(sw) and len(clear) == len(slot_clear(sw))


@needs_sde
def test_reset_zeroes_counters_and_status_reads_them(bfrt_server, tmp_path):
    """`reset` of job 7 clears its slots, then zeroes its counters at index 7; `status` reads
    the counters the switch holds ($COUNTER_SPEC_PKTS) and the registers read back."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        c.deploy()
        n = len(sw.calls("Write"))
        c.reset([7])
        sw.put("job_received", {"$COUNTER_INDEX": 7}, {"$COUNTER_SPEC_PKTS": 123456789012})
        sw.put("job_results", {"$COUNTER_INDEX": 7}, {"$COUNTER_SPEC_PKTS": 99})
        (row,) = c.status()
        regs = c.session("s1").registers
        assert regs.read("slot_flags", 9) == 4 and regs.read("slot_round", 9) == 0
    cells = [e.table_entry for r in sw.calls("Read") for e in r.entities
             if sw.schema.by_id[e.table_entry.table_id].name.startswith("pipe.")
             and e.table_entry.key.fields]
    job_counters = {"pipe." + n for n in spec.TNA_COUNTERS if n.startswith("job_")}
    assert sorted(sw.schema.by_id[e.table_id].name for e in cells) == \
        sorted(job_counters | {"pipe.slot_flags", "pipe.slot_round"})
    assert all(e.table_flags.from_hw for e in cells)  # the cells themselves, not a cache
    clear, counters = writes(sw, n)
    assert {e for _, e in clear} == slot_clear(sw)
    assert counters == [("MODIFY", ("pipe." + name, (("$COUNTER_INDEX", 7),), None,
                                    (("$COUNTER_SPEC_PKTS", 0),)))
                        for name in spec.JOB_COUNTERS if name not in spec.TNA_LACKS]
    assert (row["job"], row["installed"], row["job_received"], row["job_results"],
            row["job_aggregated"]) == (7, "yes", 123456789012, 99, 0)


@needs_sde
def test_job_removal_deletes_its_entries_group_and_nodes(bfrt_server, tmp_path):
    """Removing job 7: admission first, its rewrites, group and nodes deleted; slots cleared."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        c.deploy()
        n = len(sw.calls("Write"))
        c.set_state(st.without_job(7))
    deletes, clear = writes(sw, n)
    assert [(u, e[0]) for u, e in deletes] == \
        [("DELETE", "pipe.admission")] * 3 + [("DELETE", "pipe.worker_rewrite")] * 3 + \
        [("DELETE", "$pre.mgid")] + [("DELETE", "$pre.node")] * 3
    assert {e for _, e in clear} == slot_clear(sw)
    assert {sw.schema.by_id[t].name for t, rows in sw.tables.items() if rows
            and "$REGISTER_INDEX" not in sw.schema.by_id[t].keys} == \
        {"pipe.l2", "pipe.ina_endpoint"}


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("edit,field,msg", [
    (lambda s: s.update(api="bfruntime"), "switches[0].api", "must be one of p4runtime, bfrt"),
    (lambda s: s.update(api="bfrt"), "switches[0].device_config_format",
     "only for api p4runtime"),
    (lambda s: (s.pop("device_config_format"), s.update(target="bmv2", api="bfrt")),
     "switches[0].api", "only for target tofino"),
])
def test_the_api_field_is_validated(tmp_path, edit, field, msg):
    """`api` names one of the two APIs; a BF Runtime switch takes no P4Runtime format."""
    switch_field_refused(tmp_path, edit, field, msg)


def test_without_the_sdes_modules_one_line_names_where_it_looked(tmp_path, monkeypatch):
    """No SDE install: one line naming SDE_INSTALL's path and the package it lacks."""
    monkeypatch.setenv("SDE_INSTALL", str(tmp_path / "sde"))
    half = tmp_path / "sde" / "lib" / "python3.11" / "site-packages" / "tofino" / "bfrt_grpc"
    half.mkdir(parents=True)
    (half / "bfruntime_pb2.py").write_text("")  # one of the two modules only
    with pytest.raises(ConfigError) as e:
        bfrt.load_sde_modules()
    assert str(e.value) == (
        "BF Runtime client: no tofino/bfrt_grpc/bfruntime_pb2.py and bfruntime_pb2_grpc.py "
        f"under {tmp_path / 'sde'}/lib/python3.*/site-packages (set SDE_INSTALL to the SDE's "
        "install directory; default $SDE/install, else /opt/bf-sde/install)")
    monkeypatch.delenv("SDE_INSTALL")
    monkeypatch.setenv("SDE", str(tmp_path / "sde-src"))
    assert bfrt.sde_install() == tmp_path / "sde-src" / "install"


def test_cli_without_the_sdes_modules_exits_2_with_one_line(tmp_path):
    """`deploy` to an `api: bfrt` switch on a machine without the SDE's modules: exit 2, one
    line naming the switch, its field and where the modules were looked for."""
    doc = tofino_doc("127.0.0.1:1", STD_P4INFO, fake_bf_p4c_output(tmp_path / "out"))
    del doc["switches"][0]["device_config_format"]
    doc["switches"][0]["api"] = "bfrt"
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc))
    env = dict(os.environ, SDE_INSTALL=str(tmp_path / "no-sde"))
    out = subprocess.run([sys.executable, "-m", "controller", "-c", str(p), "deploy"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("python -m controller deploy: error: switch s1: field 'api': "
                                 "bfrt: BF Runtime client: no "
                                 "tofino/bfrt_grpc/bfruntime_pb2.py and bfruntime_pb2_grpc.py "
                                 f"under {tmp_path / 'no-sde'}/lib/python3.*/site-packages")


@needs_sde
def test_a_bfrt_json_without_a_table_is_named(bfrt_server, tmp_path):
    """A bfrt.json from another compile (no admission table; a key field of another name): one
    line naming what it lacks."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    doc = json.loads(BFRT_JSON.read_text())
    doc["tables"] = [t for t in doc["tables"] if t["name"] != "pipe.admission"]
    (tmp_path / "out" / "bfrt.json").write_text(json.dumps(doc))
    with Controller(st) as c, pytest.raises(ConfigError) as e:
        c.deploy()
    assert str(e.value) == ("the switch's BF-RT JSON has no table 'admission' (the P4Info's "
                            "table 'admission': is bfrt.json from the same compile?)")
    doc = json.loads(BFRT_JSON.read_text())
    for t in doc["tables"]:  # every table, but a key field of another name
        if t["name"] == "pipe.worker_rewrite":
            t["key"][0]["name"] = "replica"
    (tmp_path / "out" / "bfrt.json").write_text(json.dumps(doc))
    with Controller(st) as c, pytest.raises(ConfigError) as e:
        c.deploy()
    assert str(e.value) == (f"{sw.address}: BF-RT table pipe.worker_rewrite has no key field "
                            "'rid' (is the switch's bfrt.json from the compile that wrote the "
                            "P4Info?)")


@needs_sde
def test_status_reads_without_writing_once_the_controller_is_gone(bfrt_server, tmp_path):
    """`status` (no election: client 0) binds once the deploying client's stream has ended,
    reads the job's entries and counters, and writes nothing."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        c.deploy()
    sw.put("job_aggregated", {"$COUNTER_INDEX": 7}, {"$COUNTER_SPEC_PKTS": 5})
    n = len(sw.calls("Write"))
    until(lambda: sw.owner is None, "the server to see the deploying client go", 5)
    with Controller(st, election=None) as c:
        (row,) = c.status()
    assert (row["installed"], row["workers"], row["job_aggregated"]) == ("yes", 3, 5)
    assert len(sw.calls("Write")) == n
    last = sw.calls("SetForwardingPipelineConfig")[-1]
    assert (last.action, last.client_id) == (BF.SetForwardingPipelineConfigRequest.BIND, 0)


@needs_sde
def test_a_second_controller_is_refused_by_the_binding(bfrt_server, tmp_path):
    """BF Runtime binds one client per program: another client id is refused as not primary,
    and writes nothing."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        c.deploy()
        n = len(sw.calls("Write"))
        with Controller(st.with_epoch(7, 5), election=2) as other, \
                pytest.raises(NotPrimaryError, match="already owns this P4.*refusing to write"):
            other.deploy()
    assert len(sw.calls("Write")) == n


def test_the_committed_bfrt_json_has_what_the_controls_name():
    """Every table, counter and register of the std P4Info is in tofino/build's bfrt.json,
    with the key fields, actions and parameters the P4Info gives (what the client maps)."""
    info = text_format.Parse(STD_P4INFO.read_text(), pb.ForwardingPipelineConfig().p4info,
                             allow_unknown_field=True)
    schema = bfrt.BfrtSchema(BFRT_JSON.read_bytes())
    actions = {a.preamble.id: a for a in info.actions}
    for t in info.tables:
        bt = schema.table(t.preamble.name)
        assert {f.name: f.bitwidth for f in t.match_fields} == \
            {n: w for n, (_, w) in bt.keys.items()}
        for ref in t.action_refs:
            a = actions[ref.id]
            _, params = bt.action(a.preamble.name)
            assert {p.name: p.bitwidth for p in a.params} == {n: w for n, (_, w) in params.items()}
    for c in info.counters:
        assert [n for n, _, _ in schema.table(c.preamble.name).data] == ["$COUNTER_SPEC_PKTS"]
    for r in info.registers:
        n = len(info.type_info.structs[r.type_spec.struct.name].members) \
            if r.type_spec.HasField("struct") else 1
        assert len(schema.table(r.preamble.name).data) == n


@needs_sde
def test_a_changed_group_is_rewritten_node_by_node(bfrt_server, tmp_path):
    """Job 7 grows to four ranks: its group's old entry and nodes go, four nodes and the group
    come back (PRE entries have no modify of their node list here), and a read of the groups
    gives the four replicas."""
    sw = bfrt_server()
    st = bfrt_state(tmp_path, sw.address)
    with Controller(st) as c:
        c.deploy()
        n = len(sw.calls("Write"))
        doc = dict(st.raw, jobs=[dict(JOB7, members=["w0", "w1", "w2", "w3"])])
        c.set_state(state_mod.parse(doc, st.path))
        groups = c.session("s1").conn.read_groups()
    (modifies,) = writes(sw, n)
    pre = [(u, e[0], e[1]) for u, e in modifies if e[0].startswith("$pre")]
    assert pre == [("DELETE", "$pre.mgid", (("$MGID", 8),))] + \
        [("DELETE", "$pre.node", (("$MULTICAST_NODE_ID", 2048 + r),)) for r in range(3)] + \
        [("INSERT", "$pre.node", (("$MULTICAST_NODE_ID", 2048 + r),)) for r in range(4)] + \
        [("INSERT", "$pre.mgid", (("$MGID", 8),))]
    assert [(g.multicast_group_id, [(r.egress_port, r.instance) for r in g.replicas])
            for g in groups] == [(8, [(r + 1, 225 + r) for r in range(4)])]


@needs_sde
def test_a_push_the_device_never_finishes_is_an_error(bfrt_server, tmp_path):
    """The push RPC returns before the device is ready: without WARM_INIT_FINISHED on the
    stream the deploy stops with one line, binding and writing nothing."""
    sw = bfrt_server(notify=False)
    with Controller(bfrt_state(tmp_path, sw.address), timeout=0.5) as c, \
            pytest.raises(P4RuntimeError) as e:
        c.deploy()
    assert str(e.value) == (f"{sw.address}: pushed spina_tna, but no WARM_INIT_FINISHED "
                            "within 0.5 s")
    assert [r.action for r in sw.calls("SetForwardingPipelineConfig")] == \
        [BF.SetForwardingPipelineConfigRequest.VERIFY_AND_WARM_INIT_BEGIN_AND_END]
    assert sw.calls("Write") == []


def test_the_example_desired_state_loads():
    """controller/examples/tofino_bfrt.yaml (make deploy TARGET=tofino_bfrt) is a valid
    desired state naming BF Runtime and the std-externs P4Info."""
    st = state_mod.load(ROOT / "controller" / "examples" / "tofino_bfrt.yaml")
    sw = st.switches["s1"]
    assert (sw.target, sw.api, sw.device_config_format, sw.grpc) == \
        ("tofino", "bfrt", None, "127.0.0.1:50052")
    assert st.resolve(sw.p4info).resolve() == STD_P4INFO
    assert (st.jobs[1].block_size, st.jobs[1].nlanes) == (spec.TNA_SIZES["BLOCK_SIZE"], 1)
