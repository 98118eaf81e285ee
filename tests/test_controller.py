"""Controller unit tests: an in-process fake P4RuntimeServicer on port 0 records every request,
and each test asserts the exact protobuf requests the controller sent. No switch needed.

Run just this file: python -m pytest tests/test_controller.py
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
import yaml
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as pb, p4runtime_pb2_grpc

from controller import controls, model, state as state_mod
from controller.controller import Controller, format_table
from controller.p4rt import Connection, NotPrimaryError, P4RuntimeError
from controller.pipeline import cookie_of
from controller.registers import ThriftRegisters
from spina import spec
from spina.config import Assignment, ConfigError, JobFile
from spina.p4runtime import encode, match_key


# ---------------------------------------------------------------- the fake switch
class FakeSwitch(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Records requests; keeps written table entries and groups so reads see them.

    primary: whether arbitration makes the client primary (else another controller is).
    """

    def __init__(self, primary: bool = True):
        self.primary = primary
        self.requests: list[tuple[str, object]] = []
        self.config = None
        self.tables: dict[bytes, object] = {}
        self.defaults: dict[int, object] = {}
        self.groups: dict[int, object] = {}
        self.lock = threading.Lock()

    def calls(self, method: str) -> list:
        return [r for m, r in self.requests if m == method]

    def StreamChannel(self, request_iterator, context):
        for req in request_iterator:
            a = req.arbitration
            resp = pb.StreamMessageResponse()
            resp.arbitration.device_id = a.device_id
            if self.primary:
                resp.arbitration.election_id.CopyFrom(a.election_id)
                resp.arbitration.status.code = code_pb2.OK
            else:
                resp.arbitration.election_id.low = a.election_id.low + 10
                resp.arbitration.status.code = code_pb2.ALREADY_EXISTS
            yield resp

    def Capabilities(self, request, context):
        return pb.CapabilitiesResponse(p4runtime_api_version="1.4.1")

    def SetForwardingPipelineConfig(self, request, context):
        with self.lock:
            self.requests.append(("SetForwardingPipelineConfig", request))
            self.config = request.config
        return pb.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):
        if self.config is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no pipeline")
        return pb.GetForwardingPipelineConfigResponse(config=self.config)

    def Write(self, request, context):
        with self.lock:
            self.requests.append(("Write", request))
            for u in request.updates:
                e = u.entity
                if e.HasField("table_entry"):
                    t = e.table_entry
                    if t.is_default_action:
                        self.defaults[t.table_id] = t
                    elif u.type == pb.Update.DELETE:
                        self.tables.pop(match_key(t), None)
                    else:
                        self.tables[match_key(t)] = t
                elif e.HasField("packet_replication_engine_entry"):
                    g = e.packet_replication_engine_entry.multicast_group_entry
                    if u.type == pb.Update.DELETE:
                        self.groups.pop(g.multicast_group_id, None)
                    else:
                        self.groups[g.multicast_group_id] = g
        return pb.WriteResponse()

    def Read(self, request, context):
        with self.lock:
            self.requests.append(("Read", request))
            out = pb.ReadResponse()
            for q in request.entities:
                if q.HasField("table_entry"):
                    tid = q.table_entry.table_id
                    if q.table_entry.is_default_action:
                        if tid in self.defaults:
                            out.entities.add(table_entry=self.defaults[tid])
                        continue
                    out.entities.extend(pb.Entity(table_entry=t) for t in self.tables.values()
                                        if t.table_id == tid)
                elif q.HasField("packet_replication_engine_entry"):
                    out.entities.extend(pb.Entity(
                        packet_replication_engine_entry=pb.PacketReplicationEngineEntry(
                            multicast_group_entry=g)) for g in self.groups.values())
                elif q.HasField("counter_entry"):
                    e = out.entities.add()
                    e.counter_entry.CopyFrom(q.counter_entry)
                    e.counter_entry.data.packet_count = self.counter_value(
                        q.counter_entry.counter_id, q.counter_entry.index.index)
        yield out

    def counter_value(self, counter_id: int, index: int) -> int:
        """A different count for every counter and index: 1000 * (the counter's position in
        the P4Info, from 1) + index, so a mixed-up name -> counter mapping shows."""
        pos = [c.preamble.id for c in self.config.p4info.counters].index(counter_id)
        return 1000 * (pos + 1) + index


@pytest.fixture
def grpc_servers():
    """serve(servicer, add_to_server): the servicer on a free loopback port, its `address`
    set; every server stopped afterwards (the fake switches of the controller tests)."""
    servers = []

    def serve(sw, add_to_server, workers=4):
        server = grpc.server(futures.ThreadPoolExecutor(workers))
        add_to_server(sw, server)
        sw.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        servers.append(server)
        return sw
    yield serve
    for s in servers:
        s.stop(0).wait()


@pytest.fixture
def fake(grpc_servers):
    """A fake P4Runtime switch on a free loopback port, stopped afterwards."""
    return lambda primary=True: grpc_servers(FakeSwitch(primary),
                                             p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server)


class RecordingRegisters:
    """A register adapter that records clears (the P4Runtime one is tested separately)."""

    def __init__(self):
        self.cleared = []

    def clear(self, names, start, count):
        self.cleared.append((tuple(names), start, count))

    def reset(self, names):
        self.cleared.append((tuple(names), None, None))


def doc(address: str, jobs=()) -> dict:
    return {"switches": [{"name": "s1", "target": "softswitch", "grpc": address,
                          "address": "10.0.0.100", "udp_port": 47000}],
            "workers": [{"name": f"w{i}", "ip": f"10.0.0.{i + 1}", "udp_port": 50000 + i,
                         "switch_port": 0} for i in range(4)],
            "jobs": list(jobs), "agents_dir": "agents"}


JOB7 = {"id": 7, "members": ["w0", "w1"], "nslots": 2, "slot_base": 4, "block_size": 32,
        "nlanes": 4}


def renamed_p4info():
    """spec's P4Info with control-prefixed names and other IDs: nothing may be hard-coded."""
    info = spec.p4info()
    remap = {}
    for kind in ("tables", "actions", "counters", "registers"):
        for obj in getattr(info, kind):
            new = obj.preamble.id ^ 0x5A5A
            remap[obj.preamble.id] = new
            obj.preamble.id = new
            obj.preamble.name = "SpinaIngress.ctl." + obj.preamble.name
    for t in info.tables:
        for ref in t.action_refs:
            ref.id = remap[ref.id]
    return info


def ids(info, kind):
    return {o.preamble.name.rsplit(".", 1)[-1]: o.preamble.id for o in getattr(info, kind)}


def new_state(tmp_path, address, jobs=()):
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc(address, jobs)))
    return state_mod.load(p)


# ---------------------------------------------------------------- tests
def test_deploy_pushes_pipeline_then_endpoint(fake, tmp_path):
    """An empty switch gets the P4Info with its cookie, then one ina_endpoint INSERT (no job
    has a loss bound: no congestion entry)."""
    sw = fake()
    st = new_state(tmp_path, sw.address)
    with Controller(st, election=3, registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
    (push,) = sw.calls("SetForwardingPipelineConfig")
    info = spec.p4info()
    want = pb.SetForwardingPipelineConfigRequest(
        device_id=0, election_id=pb.Uint128(high=0, low=3),
        action=pb.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
    want.config.p4info.CopyFrom(info)
    want.config.cookie.cookie = cookie_of(info, b"")
    assert push == want
    (write,) = sw.calls("Write")
    t, a = ids(info, "tables"), ids(info, "actions")
    want_w = pb.WriteRequest(device_id=0, election_id=pb.Uint128(low=3))
    u = want_w.updates.add(type=pb.Update.INSERT)
    u.entity.table_entry.table_id = t["ina_endpoint"]
    u.entity.table_entry.match.add(field_id=1).exact.value = bytes([10, 0, 0, 100])
    u.entity.table_entry.action.action.action_id = a["accept_ina"]
    assert write == want_w


def test_job_entries_use_the_p4info_ids(fake, tmp_path):
    """With renamed, renumbered P4Info the job's writes carry that P4Info's IDs, in order."""
    sw = fake()
    info = renamed_p4info()
    (tmp_path / "p4info.txt").write_text(str(info))
    d = doc(sw.address, [JOB7])
    d["switches"][0]["p4info"] = "p4info.txt"
    (tmp_path / "spina.yaml").write_text(yaml.safe_dump(d))
    st = state_mod.load(tmp_path / "spina.yaml")
    regs = RecordingRegisters()
    with Controller(st, registers={"s1": regs}) as c:
        c.deploy()
    t, a = ids(info, "tables"), ids(info, "actions")
    (write,) = sw.calls("Write")
    want = pb.WriteRequest(device_id=0, election_id=pb.Uint128(low=1))
    g = want.updates.add(type=pb.Update.INSERT).entity.packet_replication_engine_entry
    g.multicast_group_entry.multicast_group_id = 8
    g.multicast_group_entry.replicas.add(egress_port=0, instance=7 * 32 + 1)
    g.multicast_group_entry.replicas.add(egress_port=0, instance=7 * 32 + 2)
    for rank in (0, 1):
        e = want.updates.add(type=pb.Update.INSERT).entity.table_entry
        e.table_id = t["worker_rewrite"]
        e.match.add(field_id=1).exact.value = encode(7 * 32 + rank + 1, 16)
        e.action.action.action_id = a["rewrite_for_worker"]
        for pid, v in ((1, b"\0"), (2, bytes([10, 0, 0, rank + 1])), (3, encode(50000 + rank, 16))):
            e.action.action.params.add(param_id=pid, value=v)
    e = want.updates.add(type=pb.Update.INSERT).entity.table_entry
    e.table_id = t["ina_endpoint"]
    e.match.add(field_id=1).exact.value = bytes([10, 0, 0, 100])
    e.action.action.action_id = a["accept_ina"]
    for rank in (0, 1):
        e = want.updates.add(type=pb.Update.INSERT).entity.table_entry
        e.table_id = t["admission"]
        for fid, v in ((1, b"\0"), (2, bytes([10, 0, 0, rank + 1])), (3, encode(50000 + rank, 16)),
                       (4, b"\x07"), (5, bytes([rank]))):
            e.match.add(field_id=fid).exact.value = v
        e.action.action.action_id = a["admit"]
        for pid, v in enumerate((1, 4, 2, 2, 32, 4, 8), start=1):
            e.action.action.params.add(param_id=pid, value=bytes([v]))
    assert write == want
    # The arriving job's slots 4..5 were cleared first: both shadow copies (cells 8..11) of the
    # per-copy registers, cells 4..5 of the per-slot ones.
    (copies, start, count), (heads, hstart, hcount) = regs.cleared
    assert (start, count, hstart, hcount) == (8, 4, 4, 2)
    assert set(heads) == {"head_round", "head_heard", "head_missing"}
    assert set(copies) | set(heads) == set(spec.p4_register_names())


def test_deploy_twice_writes_nothing(fake, tmp_path):
    """The second deploy reads the switch, finds it current and sends no Write."""
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    with Controller(st, registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
        n = len(sw.calls("Write"))
        reports = c.deploy()
    assert len(sw.calls("Write")) == n
    assert len(sw.calls("SetForwardingPipelineConfig")) == 1
    assert not reports[0].changed


def test_full_width_reads_compare_equal(fake, tmp_path):
    """A switch that reads back zero-padded bytestrings (older PI) still gets no rewrite."""
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    with Controller(st, registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
        for t in sw.tables.values():
            for m in t.match:
                m.exact.value = b"\0\0" + m.exact.value
            for prm in t.action.action.params:
                prm.value = b"\0" + prm.value
        n = len(sw.calls("Write"))
        c.deploy()
    assert len(sw.calls("Write")) == n


def test_job_removal_deletes_entries_and_clears_slots(fake, tmp_path):
    """Removing a job deletes its admission, rewrite and group, then clears its slot cells."""
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    regs = RecordingRegisters()
    with Controller(st, registers={"s1": regs}) as c:
        c.deploy()
        before = len(sw.calls("Write"))
        c.set_state(st.without_job(7))
    (write,) = sw.calls("Write")[before:]
    kinds = [(u.type, u.entity.WhichOneof("entity")) for u in write.updates]
    assert kinds == [(pb.Update.DELETE, "table_entry")] * 4 + \
        [(pb.Update.DELETE, "packet_replication_engine_entry")]
    assert write.updates[4].entity.packet_replication_engine_entry == \
        pb.PacketReplicationEngineEntry(
            multicast_group_entry=pb.MulticastGroupEntry(multicast_group_id=8))
    # on arrival, on removal: copies 8..11, slots 4..5
    assert [(s, n) for _, s, n in regs.cleared] == [(8, 4), (4, 2)] * 2
    assert {t.table_id for t in sw.tables.values()} == \
        {ids(spec.p4info(), "tables")["ina_endpoint"]}


def test_not_primary_refuses_to_write(fake, tmp_path):
    """When another controller is primary, deploy says so and sends no write of any kind."""
    sw = fake(primary=False)
    st = new_state(tmp_path, sw.address, [JOB7])
    with Controller(st, registers={"s1": RecordingRegisters()}) as c:
        with pytest.raises(NotPrimaryError, match="another controller is primary"):
            c.deploy()
    assert not sw.calls("Write") and not sw.calls("SetForwardingPipelineConfig")


def test_p4runtime_register_adapter_requests(fake, tmp_path):
    """`reset` clears a job's cells as register MODIFYs of zero and zeroes its job counters."""
    from controller.registers import P4RuntimeRegisters
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    with Controller(st) as c:
        c.deploy()
        assert isinstance(c.session("s1").registers, P4RuntimeRegisters)
        before = len(sw.calls("Write"))
        c.reset([7])
    copies_w, heads_w, counters_w = sw.calls("Write")[before:]  # one Write per clear
    info = spec.p4info()
    rid = ids(info, "registers")
    got = {(u.entity.register_entry.register_id, u.entity.register_entry.index.index)
           for w in (copies_w, heads_w) for u in w.updates}
    assert got == {(rid[n], i) for n in spec.p4_register_names()
                   for i in (range(4, 6) if n in spec.HEAD_REGISTERS else range(8, 12))}
    assert all(u.type == pb.Update.MODIFY and u.entity.register_entry.data.bitstring == b"\0"
               for w in (copies_w, heads_w) for u in w.updates)
    cid = ids(info, "counters")
    assert [(u.entity.counter_entry.counter_id, u.entity.counter_entry.index.index,
             u.entity.counter_entry.data.packet_count) for u in counters_w.updates] == \
        [(cid[n], 7, 0) for n in spec.JOB_COUNTERS]


def test_status_reads_job_counters(fake, tmp_path):
    """status reads every job counter at the job's index, each under its own name, and every
    port counter at each port; prints them as a table."""
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    with Controller(st, registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
        rows = c.status()
        ports = c.port_status()
    position = {c.preamble.name: i + 1 for i, c in enumerate(spec.p4info().counters)}
    assert rows[0]["installed"] == "yes"
    assert {n: rows[0][n] for n in spec.JOB_COUNTERS} == \
        {n: 1000 * position[n] + 7 for n in spec.JOB_COUNTERS}
    assert ports == [{"switch": "s1", "port": 0,
                      **{n: 1000 * position[n] for n in spec.PORT_COUNTERS}}]
    reads = [q.counter_entry for r in sw.calls("Read") for q in r.entities
             if q.HasField("counter_entry")]
    cid = ids(spec.p4info(), "counters")
    assert {(q.counter_id, q.index.index) for q in reads} == \
        {(cid[n], 7) for n in spec.JOB_COUNTERS} | {(cid[n], 0) for n in spec.PORT_COUNTERS}
    assert "job_received" in format_table(rows).splitlines()[0]


def test_one_apply_computes_the_job_rows_once(fake, tmp_path, monkeypatch):
    """A deploy computes a switch's job rows (controls.job_rows) once for all its controls."""
    real, calls = controls.job_rows, []
    monkeypatch.setattr(controls, "job_rows", lambda st, s: calls.append(s.name) or real(st, s))
    sw = fake()
    with Controller(new_state(tmp_path, sw.address, [JOB7]),
                    registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
    assert calls == ["s1"]
    # written: the endpoint, the group, and per worker its rewrite and admission
    assert len([u for w in sw.calls("Write") for u in w.updates]) == 6


def test_controls_read_the_counters_spec_gives_them():
    """Each counter is read by the control spina.spec.COUNTER_CONTROLS names, and only so."""
    read = {n: c.__name__ for c in controls.Control.__subclasses__() for n in c.counters}
    assert read == spec.COUNTER_CONTROLS
    assert set(spec.COUNTER_CONTROLS) == set(spec.JOB_COUNTERS + spec.PORT_COUNTERS)


def test_agent_files_name_job_rank_slots_and_switch(fake, tmp_path):
    """deploy writes a JobFile per job and an assignment per worker: job, rank, slots, switch."""
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    with Controller(st, registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
    a = Assignment.load(tmp_path / "agents" / "job7-rank1.json")
    assert (a.job.job, a.rank, a.job.slot_base, a.job.nslots, a.job.block_size,
            a.job.nlanes, a.switch) == (7, 1, 4, 2, 32, 4, ("10.0.0.100", 47000))
    assert [(w.host, w.port) for w in a.job.workers] == [("10.0.0.1", 50000), ("10.0.0.2", 50001)]
    jf = JobFile.load(tmp_path / "agents" / "job7.json")  # what agent_from_env and the daemon read
    assert (jf.job, jf.switch) == (a.job, a.switch)
    assert jf.communication is None and a.communication is None  # no section: dense SpINA
    assert JobFile.from_dict(jf.to_dict()) == jf and Assignment.from_dict(a.to_dict()) == a


def test_deploy_report_counts_agent_files_written_and_removed(fake, tmp_path):
    """The report says how many agent files a deploy wrote and how many it removed: after a
    job left, "removed", never "written" for an emptied folder (issue 44 item 7)."""
    sw = fake()
    with Controller(new_state(tmp_path, sw.address, [JOB7]),
                    registers={"s1": RecordingRegisters()}) as c:
        first = c.deploy()[0]
    assert (first.agent_files, first.agent_files_removed) == (3, 0)  # job7.json, 2 ranks
    assert str(first).endswith("; agent files: 3 written")
    with Controller(new_state(tmp_path, sw.address),
                    registers={"s1": RecordingRegisters()}) as c:
        gone = c.deploy()[0]
    assert (gone.agent_files, gone.agent_files_removed) == (0, 3)
    assert str(gone).endswith("; agent files: 3 removed")
    assert list((tmp_path / "agents").iterdir()) == []


def test_thrift_adapter_commands():
    """The BMv2 adapter clears cells with one register_write per cell in one CLI session, and
    resets whole registers with register_reset."""
    got = []
    t = ThriftRegisters(9090)
    t.run = lambda cmds: got.append(cmds) or ""
    t.clear(["slot_round", "slot_next_l0"], 8, 2)
    t.reset(["slot_round", "slot_next_l0"])
    assert got == [["register_write slot_round 8 0", "register_write slot_round 9 0",
                    "register_write slot_next_l0 8 0", "register_write slot_next_l0 9 0"],
                   ["register_reset slot_round", "register_reset slot_next_l0"]]


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["switches"][0].update(target="cisco"), "switches[0].target"),
    (lambda d: d["switches"][0].pop("grpc"), "switches[0].grpc"),
    (lambda d: d["switches"][0].update(ina_endpoints=["10.0.0.1", "10.0.0.300"]),
     "switches[0].ina_endpoints[1]"),
    (lambda d: d["switches"][0].update(ina_endpoints="10.0.0.1"), "switches[0].ina_endpoints"),
    (lambda d: d["switches"][0].update(drop_qdepth=-1), "switches[0].drop_qdepth"),
    (lambda d: d["workers"][1].update(ip="10.0.0.999"), "workers[1].ip"),
    (lambda d: d["workers"][1].update(udp_port=50000, ip="10.0.0.1"), "workers[1].udp_port"),
    (lambda d: d["workers"][0].update(switch_port=3), "workers[0].switch_port"),
    (lambda d: d["workers"][0].update(rank=1), "jobs[0].members[0]"),
    (lambda d: d["jobs"][0].update(members=["w0", "nobody"]), "jobs[0].members[1]"),
    (lambda d: d["jobs"][0].update(nslots=300), "jobs[0].nslots"),
    (lambda d: d["jobs"][0].update(priority=9), "jobs[0].priority"),
    (lambda d: d["jobs"][0].update(colour="red"), "jobs[0].colour"),
    (lambda d: d["jobs"].append(dict(JOB7, id=8, members=["w2", "w3"], slot_base=5)),
     "jobs[1].slot_base"),
    # l2 entries: a port (bridged) or a ports list (sprayed per packet), never both.
    (lambda d: d["switches"][0].update(l2=[{"mac": "02:00:00:00:02:01", "ports": []}]),
     "switches[0].l2[0].ports: must be a list of 1..255"),
    (lambda d: d["switches"][0].update(l2=[{"mac": "02:00:00:00:02:01", "ports": [3, 4, 3]}]),
     "switches[0].l2[0].ports: duplicate port 3"),
    (lambda d: d["switches"][0].update(l2=[{"mac": "02:00:00:00:02:01", "ports": [3, 512]}]),
     "switches[0].l2[0].ports[1]: must be a port number 0..511"),
    (lambda d: d["switches"][0].update(l2=[{"mac": "02:00:00:00:02:01", "ports": [3, True]}]),
     "switches[0].l2[0].ports[1]"),
    (lambda d: d["switches"][0].update(l2=[{"mac": "02:00:00:00:02:01", "ports": 3}]),
     "switches[0].l2[0].ports: must be a list"),
    (lambda d: d["switches"][0].update(
        l2=[{"mac": "02:00:00:00:02:01", "port": 2, "ports": [3, 4]}]),
     "switches[0].l2[0].ports: give either port (bridged) or ports"),
    (lambda d: d["switches"][0].update(l2=[{"mac": "02:00:00:00:02:01"}]),
     "switches[0].l2[0].port: required field is missing"),
    (lambda d: d["switches"][0].update(
        l2=[{"mac": f"02:00:00:00:{i >> 8:02x}:{i & 255:02x}", "ports": [i % 500, 500 + i % 2]}
            for i in range(257)]),
     "switches[0].l2: at most 256 different ports lists"),
])
def test_validation_names_the_field(edit, field):
    """A bad desired-state file fails with an error that names the offending field."""
    d = doc("127.0.0.1:1", [dict(JOB7)])
    edit(d)
    with pytest.raises(ConfigError, match=__import__("re").escape(field)):
        state_mod.parse(d)


def test_sprayed_l2_entry_refused_by_a_program_without_spray_ports(fake, tmp_path):
    """A program without spray_ports (the TNA P4Info) cannot take an l2 entry with ports: the
    deploy stops with an error naming the switch's l2 field."""
    from google.protobuf import text_format
    sw = fake()
    info = tmp_path / "tna.p4info.txtpb"
    info.write_text(text_format.MessageToString(spec.tna_p4info()))
    d = doc(sw.address)
    d["switches"][0].update(p4info=str(info),
                            l2=[{"mac": "02:00:00:00:02:01", "ports": [3, 4]}])
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(d))
    with Controller(state_mod.load(p), registers={"s1": RecordingRegisters()}) as c:
        with pytest.raises(ConfigError, match=r"switches\.s1\.l2: the program has no table "
                                              "'spray_ports'"):
            c.deploy()


def test_sprayed_l2_entries_name_groups_and_turns(fake, tmp_path):
    """An l2 entry with ports becomes l2 spray(group, ways) and spray_ports (group, turn) ->
    bridge(port) in list order; one group per distinct ports list, numbered as first seen."""
    sw = fake()
    d = doc(sw.address)
    d["switches"][0]["l2"] = [{"mac": "02:00:00:00:02:01", "ports": [4, 3]},
                              {"mac": "02:00:00:00:02:02", "port": 2},
                              {"mac": "02:00:00:00:02:03", "ports": [5, 6, 7]},
                              {"mac": "02:00:00:00:02:04", "ports": [4, 3]}]
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(d))
    with Controller(state_mod.load(p), registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
    info = spec.p4info()
    table, action = ({v: k for k, v in ids(info, kind).items()} for kind in ("tables", "actions"))
    got = sorted((table[t.table_id], [m.exact.value for m in t.match],
                  action[t.action.action.action_id], [x.value for x in t.action.action.params])
                 for t in sw.tables.values() if table[t.table_id] in ("l2", "spray_ports"))

    def mac(i):
        return encode(f"02:00:00:00:02:0{i}", 48)
    assert got == sorted([
        ("l2", [mac(1)], "spray", [encode(0, 8), encode(2, 8)]),
        ("l2", [mac(2)], "bridge", [encode(2, 9)]),
        ("l2", [mac(3)], "spray", [encode(1, 8), encode(3, 8)]),
        ("l2", [mac(4)], "spray", [encode(0, 8), encode(2, 8)]),
        ("spray_ports", [encode(0, 8), encode(0, 8)], "bridge", [encode(4, 9)]),
        ("spray_ports", [encode(0, 8), encode(1, 8)], "bridge", [encode(3, 9)]),
        ("spray_ports", [encode(1, 8), encode(0, 8)], "bridge", [encode(5, 9)]),
        ("spray_ports", [encode(1, 8), encode(1, 8)], "bridge", [encode(6, 9)]),
        ("spray_ports", [encode(1, 8), encode(2, 8)], "bridge", [encode(7, 9)]),
    ])


def test_job_add_allocates_non_overlapping_ranges():
    """with_job allocates the first free slot range; ranges of jobs never overlap."""
    st = state_mod.parse(doc("127.0.0.1:1", [dict(JOB7)]))  # JOB7: slots 4..5
    st = st.with_job(model.Job(id=8, members=("w2",), nslots=4))
    st = st.with_job(model.Job(id=9, members=("w3",), nslots=3))
    assert [(j.slot_base, j.nslots) for j in st.jobs.values()] == [(4, 2), (0, 4), (6, 3)]
    with pytest.raises(ConfigError, match="nslots"):
        st.with_job(model.Job(id=10, members=("w0",), nslots=250))
    assert 8 not in st.without_job(8).jobs


def test_cli_help():
    """`python -m controller --help` lists every command."""
    out = subprocess.run([sys.executable, "-m", "controller", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for cmd in ("deploy", "status", "job", "reset"):
        assert cmd in out


def test_cli_job_add_and_remove_update_the_file(fake, tmp_path, capsys):
    """`job add` allocates, saves and applies; an overlapping range is refused naming the field."""
    from controller.__main__ import main
    sw = fake()
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc(sw.address, [JOB7])))  # JOB7 holds slots 4..5
    assert main(["-c", str(p), "job", "add", "--id", "8", "--members", "w2,w3", "--nslots", "6",
                 "--block-size", "32", "--nlanes", "4"]) == 0
    assert "slots 6..11" in capsys.readouterr().out  # 0..3 is too small for 6 slots
    assert [j["id"] for j in yaml.safe_load(p.read_text())["jobs"]] == [7, 8]
    assert 9 in sw.groups  # job 8's multicast group
    assert main(["-c", str(p), "job", "add", "--id", "9", "--members", "w0", "--nslots", "2",
                 "--slot-base", "5"]) == 2
    assert "slot_base" in capsys.readouterr().err
    assert main(["-c", str(p), "job", "remove", "--id", "8"]) == 0
    assert [j["id"] for j in yaml.safe_load(p.read_text())["jobs"]] == [7]
    assert 9 not in sw.groups and 8 in sw.groups


def test_switch_endpoints_and_threshold(fake, tmp_path):
    """A switch's ina_endpoints replace its address in ina_endpoint ([] writes none); each job
    with a loss bound gets a congestion entry: its bound in 1/65536 (rounded down) and its own
    drop_qdepth, else the switch's."""
    sw = fake()
    job8 = {"id": 8, "members": ["w2", "w3"], "nslots": 2, "slot_base": 6, "block_size": 32,
            "nlanes": 4, "bounded_loss": 0.01}
    job9 = dict(job8, id=9, slot_base=8, bounded_loss=0.0)  # bound 0: no entry, never dropped
    d = doc(sw.address, [dict(JOB7, drop_qdepth=40, bounded_loss=0.1), job8, job9])
    d["switches"][0].update(ina_endpoints=["10.0.0.100", "10.0.0.101"], drop_qdepth=30)
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(d))
    with Controller(state_mod.load(p), registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
    info = spec.p4info()
    tid, aid = ids(info, "tables"), ids(info, "actions")
    assert sorted(t.match[0].exact.value for t in sw.tables.values()
                  if t.table_id == tid["ina_endpoint"]) == [encode("10.0.0.100", 32),
                                                            encode("10.0.0.101", 32)]
    congestion = {t.match[0].exact.value: (t.action.action.action_id,
                                            [x.value for x in t.action.action.params])
                  for t in sw.tables.values() if t.table_id == tid["congestion"]}
    setc = aid["set_congestion"]
    assert congestion == {encode(7, 16): (setc, [encode(40, 19), encode(6553, 16)]),
                          encode(8, 16): (setc, [encode(30, 19), encode(655, 16)])}
    d["switches"][0]["ina_endpoints"] = []
    p.write_text(yaml.safe_dump(d))
    with Controller(state_mod.load(p), registers={"s1": RecordingRegisters()}) as c:
        c.deploy()
    assert not [t for t in sw.tables.values() if t.table_id == tid["ina_endpoint"]]


def test_wipe_lets_each_control_clear_its_state(fake, tmp_path):
    """`reset --wipe`: every entry and group deleted, whole pool cleared."""
    sw = fake()
    st = new_state(tmp_path, sw.address, [JOB7])
    regs = RecordingRegisters()
    with Controller(st, registers={"s1": regs}) as c:
        c.deploy()
        assert sw.tables and sw.groups
        assert c.wipe() == [("s1", 6)]  # endpoint, 2 admission, 2 rewrite, 1 group
        assert not sw.tables and not sw.groups
        names, start, count = regs.cleared[-1]  # every slot register, every cell
        assert (start, count) == (None, None) and "slot_round" in names and "head_round" in names
        assert not c.deploy()[0].pipeline_pushed and sw.tables  # deploy restores


class HangingSwitch(FakeSwitch):
    """Arbitrates and takes the pipeline, then never answers a Write until `release`."""

    def __init__(self):
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def Write(self, request, context):
        self.writing.set()
        self.release.wait()
        return pb.WriteResponse()


@pytest.fixture
def hanging():
    sw = HangingSwitch()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(sw, server)
    sw.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    yield sw
    sw.release.set()
    server.stop(0).wait()


def test_a_call_the_switch_never_answers_fails_at_its_deadline(hanging):
    """Every RPC carries a deadline: a switch that stops answering fails the call with
    DEADLINE_EXCEEDED instead of holding the controller (and serve's locks) forever."""
    conn = Connection(hanging.address, rpc_timeout=0.5)
    try:
        with pytest.raises(P4RuntimeError, match="Write: DEADLINE_EXCEEDED") as e:
            conn.write([(pb.Update.INSERT, pb.Entity())])
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert hanging.writing.is_set()
    finally:
        conn.close()


def test_sigterm_stops_a_controller_stuck_on_a_switch(hanging, tmp_path):
    """`deploy --watch` blocked in a Write that never returns still ends on SIGTERM: after
    STOP_GRACE s it names where each thread was and exits 1, so no stopped controller keeps
    the switch's primary election (a stuck `serve` once held it through the rest of a CI)."""
    from controller.__main__ import STOP_GRACE
    path = tmp_path / "spina.yaml"
    path.write_text(yaml.safe_dump(doc(hanging.address)))
    p = subprocess.Popen([sys.executable, "-m", "controller", "-c", str(path), "deploy",
                          "--watch", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert hanging.writing.wait(30), "the controller never wrote"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=STOP_GRACE + 30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert f"controller: still running {STOP_GRACE:g} s after SIGTERM; exiting now" in err
    assert "in write" in err and "Thread 0x" in err  # faulthandler's stacks: the stuck call


def test_a_reconcile_round_that_fails_unexpectedly_never_ends_serve(tmp_path, capsys):
    """serve's reconcile loop: a round that raises a closed channel's ValueError or any other
    error says so and tries again next round; its rendezvous keeps serving the waiting ranks
    (a dead serve would close every rank's join)."""
    from argparse import Namespace

    from controller.__main__ import watch
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump(doc("127.0.0.1:1", [JOB7])))

    class Failing(Controller):
        rounds = 0

        def deploy(self, switches=None, agent_files=True):
            Failing.rounds += 1
            if Failing.rounds == 1:
                raise ValueError("Cannot invoke RPC on closed channel!")
            if Failing.rounds == 2:
                raise KeyError("a bug")
            raise KeyboardInterrupt  # how a test ends watch's loop
    ctl = Failing(state_mod.load(cfg))
    old = signal.getsignal(signal.SIGTERM)
    try:
        assert watch(Namespace(config=str(cfg), watch=0.01, switch=None), ctl) == 0
    finally:
        signal.signal(signal.SIGTERM, old)
    assert Failing.rounds == 3
    err = capsys.readouterr().err
    assert "controller: Cannot invoke RPC on closed channel!; retrying" in err
    assert "controller: reconcile failed (KeyError: 'a bug'); retrying" in err


def test_serve_says_its_rendezvous_listens_once_the_agent_files_are_written(tmp_path):
    """serve's "run rendezvous on" line (the one a script waits for before it starts its
    ranks) comes after the agent files exist and names their folder, even while no switch
    answers yet (its first deploy retries)."""
    from pathlib import Path

    from spina.net import free_port
    from spina.procs import stop_process
    root = Path(__file__).resolve().parents[1]
    cfg = tmp_path / "spina.yaml"
    rendezvous = f"127.0.0.1:{free_port()}"
    cfg.write_text(yaml.safe_dump(dict(doc("127.0.0.1:1", [JOB7]), rendezvous=rendezvous)))
    proc = subprocess.Popen([sys.executable, "-m", "controller", "-c", str(cfg), "--timeout",
                             "1", "serve"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline().strip()
        files = sorted(p.name for p in (tmp_path / "agents").glob("*.json"))
    finally:
        stop_process(proc, 10)
    assert line == (f"controller: run rendezvous on {rendezvous}, agent files in "
                    f"{tmp_path / 'agents'}")
    assert files == ["job7-rank0.json", "job7-rank1.json", "job7.json"]


def test_serve_names_another_deployments_rendezvous_on_its_address(tmp_path):
    """A second deployment's serve on the address another controller's rendezvous holds: one
    line naming that controller (its jobs, pid and file), exit 2, no agent file written."""
    import os

    from spina.rendezvous import RendezvousServer
    other = RendezvousServer("127.0.0.1", 0, {1: (4, 1)}, lambda j, e: None,
                             owner="controller", source="/srv/other/spina.yaml").start()
    host, port = other.address
    cfg = tmp_path / "spina.yaml"
    cfg.write_text(yaml.safe_dump(dict(doc("127.0.0.1:1", [JOB7]),
                                       rendezvous=f"{host}:{port}")))
    try:
        out = subprocess.run([sys.executable, "-m", "controller", "-c", str(cfg), "serve"],
                             capture_output=True, text=True, timeout=60)
    finally:
        other.stop()
    assert out.returncode == 2, out
    assert out.stderr == (f"python -m controller serve: error: {host}:{port} is the rendezvous of "
                          f"another controller (jobs [1], pid {os.getpid()}, file "
                          "/srv/other/spina.yaml)\n")
    assert not (tmp_path / "agents").exists()
