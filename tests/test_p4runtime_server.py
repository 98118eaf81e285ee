"""The software switch's P4Runtime server: write/read semantics, status codes, arbitration.

Run just this file: python -m pytest tests/test_p4runtime_server.py
"""
from __future__ import annotations

import pathlib
import queue
import threading

import grpc
import pytest
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as pb, p4runtime_pb2_grpc

from controller.p4rt import Connection, P4RuntimeError, election_id
from softswitch.dataplane import Dataplane
from softswitch.p4runtime_server import P4RuntimeServer
from spina import spec
from spina.p4runtime import encode


@pytest.fixture
def server():
    """A Dataplane behind a P4Runtime server on a free loopback port; stopped afterwards."""
    dp = Dataplane()
    srv = P4RuntimeServer(dp, "127.0.0.1:0").start()
    yield srv, dp
    srv.stop()


@pytest.fixture
def conn(server):
    """A primary connection (election id 5) with the spec pipeline pushed."""
    srv, _ = server
    c = Connection(srv.address, election=5)
    c.set_pipeline(spec.p4info(), b"", 77)
    yield c
    c.close()


def write(c, kind, entity):
    c.write([(kind, entity)])


def code_of(f) -> grpc.StatusCode:
    with pytest.raises(P4RuntimeError) as e:
        f()
    return e.value.code


def test_one_p4runtime_error():
    """The server refuses and the client fails with one error type (spina.p4runtime's)."""
    from softswitch import p4runtime_server
    from spina import p4runtime
    assert P4RuntimeError is p4runtime.P4RuntimeError is p4runtime_server.P4RuntimeError


def l2_entry(c, mac="02:00:00:00:00:01", port=1):
    return pb.Entity(table_entry=c.index.table_entry("l2", {"dst_mac": mac}, "bridge",
                                                     {"port": port}))


def test_capabilities_and_pipeline_cookie(conn):
    """Capabilities names the API version; the committed cookie is read back."""
    assert conn.capabilities() == "1.4.1"
    assert conn.get_pipeline().cookie.cookie == 77


def test_write_needs_arbitration_and_pipeline(server):
    """Without a StreamChannel a write is PERMISSION_DENIED; before a pipeline,
    FAILED_PRECONDITION."""
    srv, _ = server
    with grpc.insecure_channel(srv.address) as channel:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        req = pb.WriteRequest(device_id=0, election_id=election_id(5))
        with pytest.raises(grpc.RpcError) as e:
            stub.Write(req)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with Connection(srv.address, election=5):
            with pytest.raises(grpc.RpcError) as e:
                stub.Write(req)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_insert_modify_delete_status_codes(conn, server):
    """INSERT twice is ALREADY_EXISTS, MODIFY/DELETE of a missing entry NOT_FOUND."""
    _, dp = server
    e = l2_entry(conn)
    write(conn, pb.Update.INSERT, e)
    assert dp.l2 == {bytes.fromhex("020000000001"): 1}
    assert code_of(lambda: write(conn, pb.Update.INSERT, e)) == grpc.StatusCode.ALREADY_EXISTS
    write(conn, pb.Update.MODIFY, l2_entry(conn, port=2))
    assert dp.l2[bytes.fromhex("020000000001")] == 2
    write(conn, pb.Update.DELETE, e)
    assert dp.l2 == {}
    assert code_of(lambda: write(conn, pb.Update.DELETE, e)) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: write(conn, pb.Update.MODIFY, e)) == grpc.StatusCode.NOT_FOUND


def test_bad_values_are_invalid_argument(conn):
    """A value wider than its field, or admit with multicast group 0, is INVALID_ARGUMENT."""
    e = l2_entry(conn)
    e.table_entry.action.action.params[0].value = (1 << 9).to_bytes(2, "big")
    assert code_of(lambda: write(conn, pb.Update.INSERT, e)) == grpc.StatusCode.INVALID_ARGUMENT
    adm = conn.index.table_entry(
        "admission", {"ingress_port": 1, "src_addr": "10.0.0.1", "src_port": 1, "job": 1,
                      "rank": 0}, "admit",
        dict(epoch=1, slot_base=0, nslots=1, nworkers=1, block_size=32, nlanes=4, mcast_grp=0))
    assert code_of(lambda: write(conn, pb.Update.INSERT, pb.Entity(table_entry=adm))) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_reads_wildcard_and_exact(conn):
    """A table read returns canonical entries; a read by match returns that one entry."""
    for i in range(3):
        write(conn, pb.Update.INSERT, l2_entry(conn, f"02:00:00:00:00:0{i}", i))
    route = conn.index.table_entry("ipv4_routes", {"dst_addr": "10.1.0.0/16"}, "route",
                                   {"port": 3, "src_mac": 1, "dst_mac": 2})
    write(conn, pb.Update.INSERT, pb.Entity(table_entry=route))
    assert len(conn.read_table("l2")) == 3
    everything = conn.read([pb.Entity(table_entry=pb.TableEntry())])
    assert len(everything) == 4
    q = l2_entry(conn, "02:00:00:00:00:02", 0)
    q.table_entry.ClearField("action")
    (got,) = conn.read([q])
    assert got.table_entry.action.action.params[0].value == b"\x02"
    assert got.table_entry.match[0].exact.value == bytes.fromhex("020000000002")


def test_congestion_entries_and_fixed_defaults(conn, server):
    """A congestion entry (per job) reaches the pipeline and is read back; a bound wider than
    its 16 bits is refused naming the parameter; a default action cannot be changed."""
    _, dp = server
    e = conn.index.table_entry("congestion", {"job": 7}, "set_congestion",
                               {"qdepth": 12, "bound": 655})
    write(conn, pb.Update.INSERT, pb.Entity(table_entry=e))
    assert dp.congestion.table == {7: (12, 655)}
    (got,) = conn.read([pb.Entity(table_entry=pb.TableEntry(table_id=e.table_id))])
    assert [p.value for p in got.table_entry.action.action.params] == [b"\x0c", b"\x02\x8f"]
    wide = pb.TableEntry()
    wide.CopyFrom(e)
    wide.match[0].exact.value = b"\x08"
    wide.action.action.params[1].value = b"\x01\x00\x00"  # 65536: one bit too many
    assert code_of(lambda: write(conn, pb.Update.INSERT, pb.Entity(table_entry=wide))) == \
        grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(P4RuntimeError, match=r"set_congestion\(bound\): value 65536"):
        write(conn, pb.Update.INSERT, pb.Entity(table_entry=wide))
    write(conn, pb.Update.DELETE, pb.Entity(table_entry=e))
    assert dp.congestion.table == {}
    fixed = conn.index.table_entry("l2", {}, "bridge", {"port": 1}, default=True)
    assert code_of(lambda: write(conn, pb.Update.MODIFY, pb.Entity(table_entry=fixed))) == \
        grpc.StatusCode.PERMISSION_DENIED


def test_multicast_groups(conn, server):
    """Groups are inserted, modified, read and deleted in the Dataplane's replication engine."""
    _, dp = server

    def grp(*replicas):
        g = pb.MulticastGroupEntry(multicast_group_id=3)
        for p, r in replicas:
            g.replicas.add(egress_port=p, instance=r)
        return pb.Entity(packet_replication_engine_entry=pb.PacketReplicationEngineEntry(
            multicast_group_entry=g))
    write(conn, pb.Update.INSERT, grp((1, 10), (2, 11)))
    assert dp.mcast_groups == {3: [(1, 10), (2, 11)]}
    write(conn, pb.Update.MODIFY, grp((4, 12)))
    assert dp.mcast_groups == {3: [(4, 12)]}
    (g,) = conn.read_groups()
    assert [(r.egress_port, r.instance) for r in g.replicas] == [(4, 12)]
    write(conn, pb.Update.DELETE, grp())
    assert dp.mcast_groups == {} and conn.read_groups() == []


def test_registers_keep_the_p4_bits(conn, server):
    """Register writes land in the pipeline arrays (signed exponent too); reads give P4 bits."""
    _, dp = server

    def reg(name, index, value, width):
        e = pb.Entity()
        e.register_entry.register_id = conn.index.id("registers", name)
        if index is not None:
            e.register_entry.index.index = index
        e.register_entry.data.bitstring = encode(value, width)
        return e
    write(conn, pb.Update.MODIFY, reg("slot_exponent", 3, 0xFFFF, 16))
    write(conn, pb.Update.MODIFY, reg("slot_present", 3, (1 << 63) | 1, 64))
    write(conn, pb.Update.MODIFY, reg("slot_values_l1_e2", 3, 0xFFFFFFFE, 32))
    r = dp.pipeline.registers
    assert r["slot_exponent"][3] == -1 and int(r["slot_present"][3]) == (1 << 63) | 1
    assert r["slot_values"][3, 1 * spec.P4_SIZES["BLOCK_SIZE"] + 2] == -2
    q = reg("slot_exponent", 3, 0, 16)
    q.register_entry.ClearField("data")
    (got,) = conn.read([q])
    assert got.register_entry.data.bitstring == b"\xff\xff"
    write(conn, pb.Update.MODIFY, reg("slot_round", None, 7, 32))  # no index: every cell
    assert (r["slot_round"] == 7).all()
    assert code_of(lambda: write(conn, pb.Update.INSERT, reg("slot_round", 0, 0, 32))) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_a_wildcard_register_read_returns_every_declared_register():
    """A read of register_id 0 gives every register the P4Info declares, job_loss_credit and
    spray_turn too (BMv2, through Thrift, has both), each cell with its value. (One slot: the
    read is ~70,000 entities, each built by protobuf's pure-Python runtime.)"""
    from softswitch.p4runtime_server import SoftSwitchServicer
    dp = Dataplane(pool_slots=1)
    conn = Connection.in_process(SoftSwitchServicer(dp), 0, election=5)
    conn.set_pipeline(spec.p4info(), b"", 77)
    dp.pipeline.job_registers["job_loss_credit"][5] = 1234
    dp.spray_registers["spray_turn"][2] = 3
    names = {r.preamble.id: r.preamble.name for r in conn.index.p4info.registers}
    got = {}
    for e in conn.read([pb.Entity(register_entry=pb.RegisterEntry())]):
        r = e.register_entry
        got.setdefault(names[r.register_id], {})[r.index.index] = \
            int.from_bytes(r.data.bitstring, "big")
    declared = set(names.values())
    assert set(got) == declared
    assert got["job_loss_credit"][5] == 1234 and got["spray_turn"][2] == 3
    assert len(got["spray_turn"]) == spec.P4_SIZES["SPRAY_GROUPS"]
    assert len(got["slot_round"]) == 2  # both copies of the one slot
    conn.close()


def test_counters_read_and_reset(conn, server):
    """Counters read per index; a MODIFY sets a cell (the controller's reset)."""
    _, dp = server
    dp.pipeline.counters["job_results"][9] = 4
    assert conn.read_counters("job_results", [9, 10]) == {9: 4, 10: 0}
    e = pb.Entity()
    e.counter_entry.counter_id = conn.index.id("counters", "job_results")
    e.counter_entry.index.index = 9
    write(conn, pb.Update.MODIFY, e)
    assert dp.pipeline.counters["job_results"][9] == 0


def test_new_pipeline_starts_empty(conn, server):
    """Committing a pipeline again empties tables, groups, registers and counters."""
    _, dp = server
    write(conn, pb.Update.INSERT, l2_entry(conn))
    dp.pipeline.counters["job_received"][1] = 1
    conn.set_pipeline(spec.p4info(), b"", 78)
    assert dp.l2 == {} and conn.read_table("l2") == []
    assert dp.pipeline.counters["job_received"][1] == 0


def test_arbitration_follows_the_highest_election_id(server):
    """A higher election id takes over; the old primary is told, and regains it on close."""
    srv, _ = server
    low = Connection(srv.address, election=5)
    try:
        assert low.is_primary
        high = Connection(srv.address, election=9)
        assert high.is_primary
        a = low._arb.get(timeout=5)  # the server tells the old primary
        assert a.status.code == code_pb2.ALREADY_EXISTS and a.election_id.low == 9
        high.close()
        a = low._arb.get(timeout=5)
        assert a.status.code == code_pb2.OK and a.election_id.low == 5
    finally:
        low.close()


def test_duplicate_election_id_is_refused(server):
    """A second client with the primary's election id is refused with INVALID_ARGUMENT."""
    srv, _ = server
    with Connection(srv.address, election=5), grpc.insecure_channel(srv.address) as channel:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        q: queue.Queue = queue.Queue()
        q.put(pb.StreamMessageRequest(arbitration=pb.MasterArbitrationUpdate(
            device_id=0, election_id=election_id(5))))
        stream = stub.StreamChannel(iter(q.get, None))
        got = []
        t = threading.Thread(target=lambda: got.append(_drain(stream)))
        t.start()
        t.join(5)
        q.put(None)
        assert got == [grpc.StatusCode.INVALID_ARGUMENT]


def test_controller_with_a_held_election_id_is_not_primary(server):
    """The controller's session given an election id another client holds: NotPrimaryError
    (exit 3, as controller/README.md says) naming the other controller and --election-id
    (issue 44 item 7: a plain P4RuntimeError, exit 2)."""
    from controller.p4rt import NotPrimaryError
    srv, _ = server
    with Connection(srv.address, election=1):
        with pytest.raises(NotPrimaryError) as e:
            Connection(srv.address, election=1)
    msg = str(e.value)
    assert msg.startswith(f"{srv.address}: election id 1 is held by another controller of "
                          "this switch (a running `serve` or `deploy --watch`?)")
    assert msg.endswith("stop it, or pass another --election-id (the highest connected one "
                        "writes)")


def _drain(stream):
    try:
        for _ in stream:
            pass
    except grpc.RpcError as e:
        return e.code()
    return None


P4C_INFO = pathlib.Path(__file__).resolve().parents[1] / "p4src/build/spina_v1model.p4info.txtpb"


@pytest.mark.skipif(not P4C_INFO.exists(),
                    reason="p4src/build/spina_v1model.p4info.txtpb absent: `make p4` where p4c "
                           "exists")
def test_accepts_the_p4info_p4c_writes(server):
    """The P4Info p4c writes for p4src/ names everything the software switch implements."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    srv, _ = server
    info = text_format.Parse(P4C_INFO.read_text(), p4info_pb2.P4Info())
    with Connection(srv.address, election=5) as c:
        c.set_pipeline(info, b"", 1)
        assert c.read_table("admission") == []


def test_in_process_connection_behaves_as_over_grpc():
    """Connection.in_process on the servicer (no gRPC): arbitration, writes, reads and the
    status codes are those a gRPC client gets, and a lower election id is refused."""
    from controller.p4rt import NotPrimaryError, P4RuntimeError
    from softswitch.p4runtime_server import SoftSwitchServicer
    dp = Dataplane(pool_slots=4, slot_capacity=128)
    servicer = SoftSwitchServicer(dp)
    high = Connection.in_process(servicer, election=9)
    try:
        assert high.is_primary
        high.set_pipeline(spec.p4info(), b"", 3)
        e = l2_entry(high)
        write(high, pb.Update.INSERT, e)
        assert dp.l2 == {bytes.fromhex("020000000001"): 1}
        assert [x.SerializeToString() for x in high.read_table("l2")] == \
            [e.table_entry.SerializeToString()]
        with pytest.raises(P4RuntimeError) as err:
            write(high, pb.Update.INSERT, e)
        assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
        low = Connection.in_process(servicer, election=4)
        try:
            assert not low.is_primary and low.primary_election == 9
            low.use_pipeline(spec.p4info())
            with pytest.raises(NotPrimaryError, match="refusing to write"):
                write(low, pb.Update.DELETE, e)
        finally:
            low.close()
    finally:
        high.close()
    assert high.stream_lost == "the switch closed the stream"
    assert servicer.primary_election_id() is None  # both streams ended


def test_value_registers_beyond_the_slot_capacity_read_zero():
    """With --slot-capacity below the P4's 4 x 32 elements, a value register past the capacity
    reads 0 and takes 0 (the controller's slot clear), but refuses any other value."""
    from controller.p4rt import P4RuntimeError
    from controller.registers import P4RuntimeRegisters
    from softswitch.p4runtime_server import SoftSwitchServicer
    dp = Dataplane(pool_slots=4, slot_capacity=64)
    c = Connection.in_process(SoftSwitchServicer(dp))
    try:
        c.set_pipeline(spec.p4info(), b"", 1)
        regs = P4RuntimeRegisters(c)
        regs.clear(["slot_values_l1_e31", "slot_values_l2_e0"], 0, 8)  # col 63 exists, 64 not
        assert regs.read("slot_values_l2_e0", 3) == 0
        e = pb.Entity()
        e.register_entry.register_id = c.index.id("registers", "slot_values_l2_e0")
        e.register_entry.index.index = 3
        e.register_entry.data.bitstring = encode(5, 32)
        with pytest.raises(P4RuntimeError) as err:
            write(c, pb.Update.MODIFY, e)
        assert err.value.code == grpc.StatusCode.OUT_OF_RANGE
    finally:
        c.close()


def test_a_second_server_on_a_port_in_use_is_refused_naming_it():
    """Two software switches on one P4Runtime address would both listen (SO_REUSEPORT) and the
    controller would talk to either: the second is refused, naming the address and who holds
    it (here: this process)."""
    import os
    first = P4RuntimeServer(Dataplane(), "127.0.0.1:0").start()
    try:
        with pytest.raises(OSError, match=rf"^cannot serve P4Runtime: {first.address} "
                           rf"\(P4Runtime port\) is held by this process \(pid {os.getpid()}\)$"):
            P4RuntimeServer(Dataplane(), first.address)
    finally:
        first.stop()
    again = P4RuntimeServer(Dataplane(), first.address).start()  # free again: it starts
    again.stop()
