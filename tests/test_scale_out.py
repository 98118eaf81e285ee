"""Two-level (leaf, spine) aggregation on the software switch: the controller's fabric plan,
the leaf and spine roles packet by packet, 8 workers in 2 racks end to end (UDP mode), and the
plan as P4 rows installed through the controller on L2-mode switches (docs/scale_out.md; the
P4 program's roles have their conformance tests in bmv2_tests/test_fabric.py).

Run just this file: python -m pytest tests/test_scale_out.py
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pytest
import yaml

from bench.scale_out import FabricCluster, fabric_doc, flat, tensors
from controller import plan
from controller.controller import program_in_process
from host_agent.agent import Agent, SpinaTimeout
from softswitch.dataplane import Dataplane
from softswitch.fabric import TO_GROUP, TO_SENDER, TO_UPSTREAM, FabricRoles
from softswitch.pipeline import Pipeline
from softswitch.udp import Faults, UdpSwitch
from spina import rows, wire
from spina.config import Assignment, ConfigError, JobConfig, JobFile, WorkerAddr, load_worker_file


# ---------------------------------------------------------------- the plan
def test_plan_levels_ranks_and_shards():
    """A valid plan: one level per switch, ranks rack by rack, each spine admits its shard with
    the leaves as workers, each leaf its rack with the spines' addresses per slot range."""
    f = plan.parse(fabric_doc())
    assert f.levels == {"leaf0": "leaf", "leaf1": "leaf", "spine0": "spine", "spine1": "spine"}
    job = f.jobs[7]
    assert f.members(job) == tuple(f"w{i}" for i in range(8))
    cfg = f.job_config(job)
    assert [(w.rank, w.port) for w in cfg.workers] == [(r, 50000 + r) for r in range(8)]
    assert cfg.slot_groups == (0, 0, 1, 1)  # each slot's spine: the agents' fast retransmit
    assert f.agent_switch("w5") == ("127.0.0.1", 47002)
    (s0,) = f.spine_jobs("spine0")
    (s1,) = f.spine_jobs("spine1")
    assert (s0.slot_base, s0.nslots, s1.slot_base, s1.nslots) == (0, 2, 2, 2)
    assert [(w.rank, w.port) for w in s1.workers] == [(0, 47001), (1, 47002)]
    assert cfg.racks == (4, 4) and cfg.nworkers == 8
    assert [(cfg.switch_rank(r), cfg.switch_ranks(r)) for r in (0, 3, 4, 7)] == [
        (0, 4), (3, 4), (0, 4), (3, 4)]  # the rank each worker sends to its leaf
    assert f.leaf_jobs("leaf1") == [(job, 1)]
    ups = plan.p4_rows(f, "leaf1").table("leaf_upstream")
    sp0, sp1 = (f.state.switches[n].address for n in ("spine0", "spine1"))
    assert [(k["slot"], p["dst_addr"], p["port"]) for k, _, p in ups] == [
        (0, sp0, 0), (1, sp0, 0), (2, sp1, 0), (3, sp1, 0)]  # UDP mode: no links, port 0
    assert f.leaf_jobs("spine0") == [] and f.spine_jobs("leaf0") == []


def _edit(fn):
    doc = fabric_doc()
    fn(doc)
    return doc


def _many_racks(doc, n=33):
    doc["switches"] += [{"name": f"x{i}", "target": "softswitch", "grpc": "in-process",
                         "udp_port": 48000 + i} for i in range(n)]
    doc["workers"] += [{"name": f"xw{i}", "ip": "127.0.0.1", "udp_port": 51000 + i,
                        "switch_port": 0, "switch": f"x{i}"} for i in range(n)]
    doc["fabric"]["racks"] += [{"name": f"xr{i}", "leaf": f"x{i}", "workers": [f"xw{i}"]}
                               for i in range(n)]
    doc["fabric"]["jobs"][0]["racks"] = [f"xr{i}" for i in range(n)]


def _big_rack(doc):
    doc["workers"] += [{"name": f"xw{i}", "ip": "127.0.0.1", "udp_port": 51000 + i,
                        "switch_port": 0, "switch": "leaf0"} for i in range(29)]
    doc["fabric"]["racks"][0]["workers"] += [f"xw{i}" for i in range(29)]


WRONG_PLANS = [
    # (edit, the field the error names, words of the message)
    (lambda d: d["fabric"]["jobs"][0]["shards"].__setitem__(
        1, {"spine": "spine1", "slot_base": 1, "nslots": 3}),
     "fabric.jobs[0].shards[1].slot_base", "slot 1 is also owned by spine 'spine0'"),
    (lambda d: d["fabric"]["racks"][1].pop("leaf"), "fabric.racks[1].leaf", "required field"),
    (lambda d: d["fabric"]["racks"][1].__setitem__("leaf", "leaf9"), "fabric.racks[1].leaf",
     "unknown switch 'leaf9'"),
    (lambda d: d["fabric"]["spines"].append("nosuch"), "fabric.spines[2]", "unknown switch"),
    (lambda d: d["fabric"]["jobs"][0]["shards"][0].__setitem__("spine", "leaf0"),
     "fabric.jobs[0].shards[0].spine", "not one of fabric.spines"),
    (lambda d: d["fabric"]["spines"].append("leaf1"), "fabric.spines[2]", "one level per switch"),
    (_many_racks, "fabric.jobs[0].racks", "1..32 racks"),
    (_big_rack, "fabric.racks[0].workers", "1..32 workers"),
    (lambda d: d["fabric"]["jobs"][0]["shards"].pop(), "fabric.jobs[0].shards",
     "owned by no spine"),
    # Issue 26: a job id whose replication ids overflow 16 bits (deploying 3000 ended in a
    # traceback), and the job fields of the one schema, checked as for a flat job.
    (lambda d: d["fabric"]["jobs"][0].__setitem__("id", 3000), "fabric.jobs[0].id",
     "must be in 0..2046"),
    (lambda d: d["fabric"]["jobs"][0].__setitem__("bounded_loss", 1.5),
     "fabric.jobs[0].bounded_loss", "must be a fraction in [0, 1)"),
    (lambda d: d["fabric"]["jobs"][0].__setitem__("priority_policy", 3),
     "fabric.jobs[0].priority_policy", "is not a string"),
    (lambda d: d["fabric"]["racks"][1]["workers"].append("w0"), "fabric.racks[1].workers[4]",
     "also in rack 'r0'"),
    (lambda d: d["fabric"]["racks"][0]["workers"].append("w4"), "fabric.racks[0].workers[4]",
     "sits on switch 'leaf1'"),
    (lambda d: d["switches"][0].__setitem__("pool_slots", 2), "fabric.jobs[0].nslots",
     "exceed switch leaf0's pool of 2"),
    (lambda d: d["fabric"]["jobs"][0].__setitem__("racks", ["r0", "r0"]),
     "fabric.jobs[0].racks[1]", "listed twice"),
    (lambda d: d.pop("fabric"), "fabric", "required field"),
]


@pytest.mark.parametrize("edit,field,words", WRONG_PLANS)
def test_wrong_plan_names_the_field(edit, field, words):
    """Each wrong plan is rejected with an error that names the offending field."""
    with pytest.raises(ConfigError) as e:
        plan.parse(_edit(edit))
    assert str(e.value).startswith(f"{field}: ") and words in str(e.value), str(e.value)


def test_plan_of_more_than_32_workers_in_a_job():
    """32 racks of 32 workers: the job's 1024 ranks go rack by rack, each rank's assignment
    names the rank its leaf knows (0..31) and the rack size; 33 racks or a rack of 33
    workers are refused naming the field (the wire's 32-bit bitmaps at each switch)."""
    f = plan.parse(fabric_doc(racks=32, per_rack=32, spines=1))
    cfg = f.job_config(f.jobs[7])
    assert cfg.nworkers == 1024 and cfg.racks == (32,) * 32
    assert [cfg.switch_rank(r) for r in (0, 31, 32, 1000, 1023)] == [0, 31, 0, 8, 31]
    assert f.leaf_jobs("leaf31") == [(f.jobs[7], 31)]
    a = Assignment(cfg, 1000, f.agent_switch("w1000")).to_dict()
    assert (a["rank"], a["switch_rank"], a["switch_ranks"]) == (1000, 8, 32)
    assert Assignment.from_dict(a).job == cfg
    with pytest.raises(ConfigError, match=r"^fabric.jobs\[0\].racks: must list 1..32 racks"):
        plan.parse(fabric_doc(racks=33, per_rack=1, spines=1))
    with pytest.raises(ConfigError, match=r"^fabric.racks\[0\].workers: must list 1..32 workers"):
        plan.parse(fabric_doc(racks=2, per_rack=33, spines=1))


def _job(n, racks=()):
    return dict(job=7, racks=list(racks),
                workers=[{"host": "127.0.0.1", "port": 50000 + r} for r in range(n)])


@pytest.mark.parametrize("doc,field,words", [
    (_job(33), "workers", "need 1..32 workers (a flat job; more need 'racks'), got 33"),
    (_job(40, [20, 21]), "racks", "add up to 41, the job has 40 workers"),
    (_job(40, [33, 7]), "racks[0]", "a rack has 1..32 workers"),
    (_job(33, [1] * 33), "racks", "need 1..32 racks"),
    (_job(4, [2, "2"]), "racks[1]", "got '2'"),
    ({**_job(4), "racks": 4}, "racks", "must be a list of rack sizes"),
])
def test_job_config_racks_errors_name_the_field(doc, field, words):
    """A job's rack sizes: each 1..32, at most 32 racks, adding up to the workers; a flat job
    (no racks) has at most 32 workers."""
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(doc)
    assert f"field '{field}': " in str(e.value) and words in str(e.value), str(e.value)


def test_a_two_level_ranks_assignment_file(tmp_path):
    """The controller's assignment of job rank 25 of 40 (racks 20, 20) says switch rank 5 of
    20; the agent paths (DDP hook, daemon) load it as that rank's job file; another rank, or a
    file whose switch_rank disagrees with the racks, is refused naming the field."""
    cfg = JobConfig.from_dict(_job(40, [20, 20]))
    path = tmp_path / "job7-rank25.json"
    doc = Assignment(cfg, 25, ("127.0.0.1", 47002)).to_dict()
    assert (doc["rank"], doc["switch_rank"], doc["switch_ranks"]) == (25, 5, 20)
    path.write_text(json.dumps(doc))
    jf = load_worker_file(path, 25)
    assert (jf.job, jf.switch) == (cfg, ("127.0.0.1", 47002))
    with pytest.raises(ConfigError, match=r"field 'rank': the file is rank 25's, this worker"):
        load_worker_file(path, 24)
    path.write_text(json.dumps({**doc, "switch_rank": 25}))
    with pytest.raises(ConfigError, match=r"assignment: field 'switch_rank': 25, but rank 25 "):
        load_worker_file(path, 25)
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps(JobFile(JobConfig.from_dict(_job(4)), ("127.0.0.1", 1)).to_dict()))
    assert load_worker_file(flat, 3).job.nworkers == 4


def test_plan_load_names_the_file(tmp_path):
    """plan.load reads YAML; a wrong field is reported with the file's path."""
    good = tmp_path / "fabric.yaml"
    good.write_text(yaml.safe_dump(fabric_doc()))
    assert sorted(plan.load(good).jobs) == [7]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_edit(lambda d: d["fabric"]["racks"][0].pop("leaf"))))
    with pytest.raises(ConfigError, match=rf"^{bad}: fabric.racks\[0\].leaf: "):
        plan.load(bad)


# ---------------------------------------------------------------- the roles, packet by packet
K, BS = 2, 4
WORKER = [(0, ("10.0.0.1", 5000 + r)) for r in range(4)]  # (ingress port, source) per rank
LEAF = [(0, ("10.0.1.1", 47000 + i)) for i in range(2)]    # as the spine sees the leaves
SPINE = (0, ("10.0.2.1", 47000))                           # as the leaves see the spine
UP = SPINE + (bytes(6),)  # leaf_upstream's spine: port, (IPv4, UDP port), MAC (none here)
JOB = JobConfig(job=1, workers=tuple(WorkerAddr(r, *WORKER[r][1]) for r in range(4)),
                slot_base=0, nslots=2, nlanes=K, block_size=BS, epoch=3, racks=(2, 2))
SPINE_JOB = JobConfig(job=1, workers=tuple(WorkerAddr(i, *LEAF[i][1]) for i in range(2)),
                      slot_base=0, nslots=2, nlanes=K, block_size=BS, epoch=3)


def leaf(rack: int) -> FabricRoles:
    """Leaf `rack` of JOB (job ranks 2*rack, 2*rack+1: local ranks 0, 1), all slots owned by
    SPINE: a switch given the rows the plan writes for it (spina.rows.leaf_job)."""
    dp = Dataplane(pool_slots=4, slot_capacity=K * BS)
    dp.apply(rows.leaf_job(JOB, rack, [rows.Sender(0, *WORKER[2 * rack + r][1]) for r in (0, 1)],
                           [rows.Upstream(0, 2, SPINE[0], SPINE[1][0])]))
    return dp.roles


def spine() -> FabricRoles:
    dp = Dataplane(pool_slots=4, slot_capacity=K * BS)
    dp.apply(rows.spine_job(JOB, 0, 2, [rows.Sender(0, *LEAF[i][1]) for i in range(2)]))
    return dp.roles


def header(**kw) -> wire.Header:
    d = dict(job=1, epoch=3, call=9, slot=1, round=5, nlanes=K, block_size=BS, length=100)
    d.update(kw)
    return wire.Header(**d)


def contrib(rank, lanes, nxt, exponent=0, **kw) -> bytes:
    """Rank's contribution to slot 1 round 5: lanes {lane: value}, each block filled with it."""
    data = [np.full(BS, v, np.int32) for _, v in sorted(lanes.items())]
    present = sum(1 << lane for lane in lanes)
    return wire.pack(header(rank=rank, exponent=exponent, present=present, **kw), nxt,
                     np.array(data) if data else None)


def run(role, pkt, src):
    out = bytearray(role.pipeline.max_packet_len)
    with role.pipeline.lock:
        n, to, key = role.process_into(pkt, src[0], src[1], out)
    return bytes(out[:n]), to, key


# Rack 0: rank 0 sends lane 0 (= 1), rank 1 lanes 0 and 1 (= 2, 3). Rack 1: rank 2 nothing,
# rank 3 lane 1 (= 10). Next positions and exponents differ per rank. Each worker sends its
# rank within the rack (0, 1 in each).
RACK0 = [contrib(0, {0: 1}, [7, 20], 2), contrib(1, {0: 2, 1: 3}, [9, 11], 5, flags=wire.FLAG_LAST)]
RACK1 = [contrib(0, {}, [8, wire.END], -32768), contrib(1, {1: 10}, [30, 12], 4)]
PARTIAL0 = wire.pack(header(rank=0, exponent=5, bitmap=0b0011, present=0b11),
                     [7, 11], np.array([[3] * BS, [3] * BS], np.int32))
PARTIAL1 = wire.pack(header(rank=1, exponent=4, bitmap=0b11, present=0b10),
                     [8, 12], np.array([[10] * BS], np.int32))
RESULT = wire.pack(header(msg_type=wire.MSG_RESULT, rank=1, exponent=5, bitmap=0b11,
                          present=0b11), [7, 11], np.array([[3] * BS, [13] * BS], np.int32))


def completed_leaves():
    """Both leaves with their racks' round complete, and what each sent up."""
    leaves, ups = [leaf(0), leaf(1)], []
    for lf, pkts, base in zip(leaves, (RACK0, RACK1), (0, 2)):
        assert run(lf, pkts[0], WORKER[base]) == (b"", 0, None)
        ups.append(run(lf, pkts[1], WORKER[base + 1]))
    return leaves, ups


def test_leaf_sends_one_partial_up():
    """A rack's last contribution makes one partial to the spine: sums of the present lanes,
    OR of present, minimum next, maximum exponent, AND of last, rank = the rack's index."""
    (l0, l1), ups = completed_leaves()
    assert ups[0] == (PARTIAL0, TO_UPSTREAM, UP)
    assert ups[1] == (PARTIAL1, TO_UPSTREAM, UP)
    r = l0.pipeline.registers
    idx = 2 * 1 + 1
    assert (r["slot_count"][idx], r["slot_bitmap"][idx], r["slot_round"][idx]) == (2, 0b11, 5)
    assert l0.pipeline.job_counters(1)["job_aggregated"] == 2


def test_spine_adds_partials_and_multicasts():
    """The spine sums the two racks' partials and multicasts the result to both leaves; a
    repeated partial is a duplicate, answered with a status while the round is open."""
    sp = spine()
    assert run(sp, PARTIAL0, LEAF[0]) == (b"", 0, None)
    status = wire.pack(header(msg_type=wire.MSG_STATUS, flags=wire.FLAG_RESEND, rank=0,
                              exponent=5, bitmap=0b01), [7, 11])
    # A spine's status goes to every leaf (a leaf that stored the result replays it).
    assert run(sp, patched(PARTIAL0, flags=wire.FLAG_RESEND), LEAF[0]) == (status, TO_GROUP, 1)
    assert run(sp, PARTIAL1, LEAF[1]) == (RESULT, TO_GROUP, 1)
    assert sp.pipeline.job_counters(1)["job_duplicates"] == 1


def patched(pkt: bytes, **fields) -> bytes:
    """`pkt` with some header fields changed."""
    return wire.pack_header(wire.unpack_header(pkt).copy(**fields)) + pkt[wire.HEADER_LEN:]


def relayed(flags=0, rank=1) -> bytes:
    """RESULT as a leaf hands it to its rack: the spine's rack bitmap as the rack's local
    ranks in its partial (`rank`: the sender of the packet answered, as in any result)."""
    return patched(RESULT, bitmap=0b11, flags=flags, rank=rank)


def test_leaf_stores_the_spine_result_and_answers_resends_itself():
    """The spine's result is stored in the leaf's slot copy and replicated to the rack; a
    worker's resend then gets the stored result from the leaf; a repeated result is dropped."""
    (l0, _), _ = completed_leaves()
    assert run(l0, RESULT, SPINE) == (relayed(), TO_GROUP, 1)
    r, idx = l0.pipeline.registers, 3
    assert (r["slot_count"][idx], r["slot_bitmap"][idx], r["slot_present"][idx]) == (3, 0b11, 3)
    assert (r["slot_values"][idx] == [3] * BS + [13] * BS).all()
    assert list(r["slot_next"][idx][:K]) == [7, 11]
    resend = patched(RACK0[0], flags=wire.FLAG_RESEND)
    assert run(l0, resend, WORKER[0]) == (relayed(wire.FLAG_RESEND, rank=0), TO_SENDER, None)
    before = l0.pipeline.job_counters(1)["job_duplicates"]
    assert run(l0, RESULT, SPINE) == (b"", 0, None)
    assert l0.pipeline.job_counters(1)["job_duplicates"] == before + 1


def test_resend_before_the_spine_result_resends_the_partial():
    """The designated worker's (the rack's local rank 0's) resend while its rack is complete
    but the spine's result missing makes the leaf resend its partial; the spine's status comes
    back to the rack as every local rank (only other racks can complete it), its stored result
    (to a later resend) is stored and multicast as a completion."""
    (l0, l1), ups = completed_leaves()
    sp = spine()
    resend = patched(RACK0[0], flags=wire.FLAG_RESEND)
    up_again = patched(PARTIAL0, flags=wire.FLAG_RESEND)
    assert run(l0, resend, WORKER[0]) == (up_again, TO_UPSTREAM, UP)
    # The first partial was lost: the spine adds the resent one.
    assert run(sp, up_again, LEAF[0]) == (b"", 0, None)
    status, to, _ = run(sp, up_again, LEAF[0])
    assert to == TO_GROUP and wire.unpack_header(status).bitmap == 0b01
    # Rack 1's leaf, still waiting for the spine too, ignores rack 0's status.
    assert run(l1, status, SPINE) == (b"", 0, None)
    out, to, key = run(l0, status, SPINE)
    assert (to, key, wire.unpack_header(out).bitmap) == (TO_GROUP, 1, 0b11)
    assert out[wire.HEADER_LEN:] == status[wire.HEADER_LEN:]
    assert run(sp, ups[1][0], LEAF[1])[1] == TO_GROUP  # rack 1 completes the spine's round
    answer, to, _ = run(sp, up_again, LEAF[0])
    assert to == TO_SENDER and answer == patched(RESULT, flags=wire.FLAG_RESEND, rank=0)
    assert run(l0, answer, SPINE) == (relayed(rank=0), TO_GROUP, 1)


def test_a_restarted_spine_takes_the_result_a_leaf_stored():
    """The spine's result reached leaf 0 but was lost to leaf 1, then the spine restarted
    (registers lost). Rack 0 never sends the round again; rack 1's designated worker resends:
    the new spine adds leaf 1's partial and, at the next resend, sends its status to every
    leaf; leaf 0 stored the result and sees its rack missing, so it replays the result up
    (REPLAY); the spine takes it as the round's result, complete, and multicasts it: leaf 1
    stores it and replicates it to its rack exactly as the lost one, leaf 0 drops it."""
    (l0, l1), ups = completed_leaves()
    old = spine()
    run(old, ups[0][0], LEAF[0])
    assert run(old, ups[1][0], LEAF[1]) == (RESULT, TO_GROUP, 1)
    assert run(l0, RESULT, SPINE) == (relayed(), TO_GROUP, 1)  # lost on the way to leaf 1
    sp = spine()  # the restarted spine
    resend = patched(RACK1[0], flags=wire.FLAG_RESEND)  # rank 2: rack 1's designated worker
    up_again = patched(PARTIAL1, flags=wire.FLAG_RESEND)
    assert run(l1, resend, WORKER[2]) == (up_again, TO_UPSTREAM, UP)
    assert run(sp, up_again, LEAF[1]) == (b"", 0, None)
    status, to, key = run(sp, up_again, LEAF[1])
    assert (to, key) == (TO_GROUP, 1)
    assert wire.unpack_header(status).bitmap == 0b10  # rack 0 missing
    replay, to, key = run(l0, status, SPINE)
    h = wire.unpack_header(replay)
    assert (to, key, h.msg_type, h.rank) == (TO_UPSTREAM, UP, wire.MSG_CONTRIB, 0)
    assert h.flags == wire.FLAG_RESEND | wire.FLAG_REPLAY
    assert replay[wire.HEADER_LEN:] == RESULT[wire.HEADER_LEN:]  # next positions and sums
    result, to, key = run(sp, replay, LEAF[0])
    assert (to, key) == (TO_GROUP, 1)
    assert result == patched(RESULT, rank=0)  # the lost result, every rack's bit set
    c = sp.pipeline.job_counters(1)
    assert (c["job_aggregated"], c["job_results"]) == (1, 2)
    assert run(l1, result, SPINE) == (relayed(rank=0), TO_GROUP, 1)
    assert run(l0, result, SPINE) == (b"", 0, None)
    # The round is complete at the spine: another replay gets the stored result back.
    assert run(sp, replay, LEAF[0])[1] == TO_SENDER
    # A status naming leaf 0's rack, or its own status, makes no replay.
    assert run(l0, patched(status, bitmap=0b11), SPINE) == (b"", 0, None)


def test_only_the_designated_worker_makes_the_partial_go_up_again():
    """Rack 1's second rank (local 1) resends a round whose spine result is missing: nothing
    leaves (its designated worker, local rank 0, waits for the same result and resends),
    counted once as a duplicate; its flush request does go up; local rank 0's resend goes up.
    None counts a result."""
    (_, l1), _ = completed_leaves()
    counters = l1.pipeline.job_counters
    assert counters(1)["job_duplicates"] == 0
    assert run(l1, patched(RACK1[1], flags=wire.FLAG_RESEND), WORKER[3]) == (b"", 0, None)
    assert run(l1, patched(RACK1[1], flags=wire.FLAG_RESEND | wire.FLAG_LOSS_TOLERANT),
               WORKER[3]) == (b"", 0, None)
    assert counters(1)["job_duplicates"] == 2
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    assert run(l1, patched(RACK1[1], flags=flush), WORKER[3]) == (
        patched(PARTIAL1, flags=flush), TO_UPSTREAM, UP)
    assert run(l1, patched(RACK1[0], flags=wire.FLAG_RESEND), WORKER[2]) == (
        patched(PARTIAL1, flags=wire.FLAG_RESEND), TO_UPSTREAM, UP)
    c = counters(1)
    assert (c["job_duplicates"], c["job_results"], c["job_aggregated"]) == (4, 0, 2)
    assert l1.pipeline.registers["slot_count"][3] == 2


def test_leaf_status_names_only_its_racks_missing_ranks():
    """A resend to a round the rack has not completed: a status naming the rack's local ranks
    heard (local rank 0 of 0..1), so the agent blames only its own rack's missing workers."""
    l0 = leaf(0)
    run(l0, RACK0[0], WORKER[0])
    out, to, _ = run(l0, patched(RACK0[0], flags=wire.FLAG_RESEND), WORKER[0])
    h = wire.unpack_header(out)
    assert (to, h.msg_type, h.bitmap) == (TO_SENDER, wire.MSG_STATUS, 0b01)


def test_spine_results_bitmap_as_local_ranks():
    """The spine's rack bitmap at the leaf: with the rack's bit, the local ranks its partial
    carried (a rack flushed without local rank 1: 0b01); without it (the spine flushed the
    round without this rack), none: the agents count their blocks as lost."""
    l0 = leaf(0)
    run(l0, RACK0[0], WORKER[0])
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    up, to, _ = run(l0, patched(RACK0[0], flags=flush), WORKER[0])
    assert to == TO_UPSTREAM and wire.unpack_header(up).bitmap == 0b01
    down, to, _ = run(l0, patched(RESULT, flags=wire.FLAG_PARTIAL), SPINE)
    assert to == TO_GROUP and wire.unpack_header(down).bitmap == 0b01
    (_, l1), _ = completed_leaves()
    down, to, _ = run(l1, patched(RESULT, bitmap=0b01, flags=wire.FLAG_PARTIAL), SPINE)
    assert to == TO_GROUP and wire.unpack_header(down).bitmap == 0
    assert l1.pipeline.registers["slot_bitmap"][3] == 0


def test_leaf_checks_what_comes_from_the_spine():
    """A spine result from a switch that does not own the slot, of another epoch, or of a
    round the slot copy does not hold is dropped and counted; nothing is stored."""
    (l0, _), _ = completed_leaves()
    other = (0, ("10.0.2.9", 47000))  # not the spine owning the slot
    stale_epoch, old_round = patched(RESULT, epoch=4), patched(RESULT, round=3)
    c0 = l0.pipeline.job_counters(1)
    assert run(l0, RESULT, other) == (b"", 0, None)
    assert run(l0, stale_epoch, SPINE) == (b"", 0, None)
    assert run(l0, old_round, SPINE) == (b"", 0, None)
    c1 = l0.pipeline.job_counters(1)
    assert c1["job_stale"] - c0["job_stale"] == 2
    assert l0.pipeline.port_counters(0)["port_unadmitted"] == 1
    assert l0.pipeline.registers["slot_count"][3] == 2


def test_a_racks_length_mismatch_reaches_every_rack():
    """Lengths that disagree inside one rack: the partial says mismatch, the spine ORs it
    into the round, every rack's result says mismatch."""
    l0, l1, sp = leaf(0), leaf(1), spine()
    run(l0, RACK0[0], WORKER[0])
    bad = contrib(1, {0: 2, 1: 3}, [9, 11], 5, flags=wire.FLAG_LAST, length=99)
    up0, _, _ = run(l0, bad, WORKER[1])
    assert wire.unpack_header(up0).flags & wire.FLAG_MISMATCH
    run(l1, RACK1[0], WORKER[2])
    up1, _, _ = run(l1, RACK1[1], WORKER[3])
    run(sp, up0, LEAF[0])
    result, to, _ = run(sp, up1, LEAF[1])
    assert to == TO_GROUP and wire.unpack_header(result).flags & wire.FLAG_MISMATCH
    assert sp.pipeline.registers["slot_flags"][3] & wire.FLAG_MISMATCH
    down, _, _ = run(l1, result, SPINE)
    assert wire.unpack_header(down).flags & wire.FLAG_MISMATCH


def test_a_flat_job_on_a_leaf_switch_is_unchanged():
    """A job admitted the ordinary way on a leaf switch: the same packets out as a plain
    pipeline, multicast to its workers."""
    flat = JobConfig(job=2, workers=JOB.workers[:2], slot_base=2, nslots=2, nlanes=K,
                     block_size=BS, epoch=3)
    l0, plain = leaf(0), Pipeline(pool_slots=4, slot_capacity=K * BS)
    for p in (l0.pipeline, plain):
        p.add_job(flat, {r: WORKER[r] for r in range(2)})
    pkts = [wire.pack(header(job=2, slot=2, rank=r, present=1), [wire.END] * K,
                      np.full((1, BS), r + 1, np.int32)) for r in range(2)]
    run(l0, pkts[0], WORKER[0])
    plain.process(pkts[0], *WORKER[0])
    (emit,) = plain.process(pkts[1], *WORKER[1])
    assert run(l0, pkts[1], WORKER[1]) == (emit.data, TO_GROUP, 2)


# ---------------------------------------------------------------- end to end: 8 workers, 2 racks
@pytest.fixture
def fabric():
    with FabricCluster() as f:
        yield f


@pytest.mark.parametrize("density", [0.01, 1.0])
def test_two_levels_are_exact_and_bit_identical(fabric, density):
    """8 workers in 2 racks through 2 leaves and a spine: int32 sums exact, float32 results
    bit-identical on every rank and to flat aggregation on one switch."""
    ints = tensors(density, 1, integer=True)
    for r in fabric.allreduce(ints):
        assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
    floats = tensors(density, 2)
    got = fabric.allreduce(floats)
    want, _, _ = flat(floats)
    for r in got:
        assert r.tobytes() == got[0].tobytes() == want[0].tobytes()
    assert np.abs(got[0] - np.sum(floats, axis=0, dtype=np.float64)).max() < 1e-5
    # Per level: each rack's 4 contributions per round at its leaf, 2 partials at the spine.
    st = plan.status(fabric.plan, dict(zip(("leaf0", "leaf1", "spine0"), fabric.switches)))
    spine_rounds = st["spine"]["spine0"][7]["job_aggregated"] // 2
    assert spine_rounds >= 2 * 4  # two calls, at least their setup rounds on 4 slots
    for leaf in ("leaf0", "leaf1"):
        assert st["leaf"][leaf][7]["job_aggregated"] == 4 * spine_rounds
    # one result per leaf and round, plus answers to resends (a loaded machine times out)
    assert st["spine"]["spine0"][7]["job_results"] >= 2 * spine_rounds


def test_sixteen_workers_in_four_racks():
    """16 workers in 4 racks of 4, slots sharded over 2 spines, 1% loss and reordering on every
    switch: int32 sums exact on every rank at 1% and 100% density."""
    faults = lambda i: Faults(drop_in=0.01, drop_out=0.01, reorder=0.01, seed=40 + i)  # noqa: E731
    with FabricCluster(racks=4, spines=2, faults=faults) as f:
        for density in (0.01, 1.0):
            ints = tensors(density, 6, nranks=16, integer=True)
            want = np.sum(ints, axis=0, dtype=np.int32)
            for r in f.allreduce(ints):
                assert np.array_equal(r, want)


LOSSY = lambda i: Faults(drop_in=0.01, drop_out=0.01, duplicate=0.01,  # noqa: E731
                         reorder=0.01, seed=70 + i)


@pytest.mark.parametrize("racks,per_rack,spines", [
    (2, 20, 1),          # 40 workers: more than one switch's 32
    (3, [3, 32, 6], 1),  # 41 workers in unequal racks, one of them full (32)
    (2, 20, 2),          # 40 workers, the slots sharded over 2 spines (2 slot groups of 2)
])
def test_more_than_32_workers_with_loss_on_every_switch(racks, per_rack, spines):
    """A job of more than 32 workers (each sends its rank within its rack; the job's total N
    in the quantization), 1% of datagrams lost into and out of every switch, 1% duplicated,
    1% reordered: int32 sums exact on every rank and float32 results bit-identical on every
    rank, within the quantization's bound of the float64 sum, at 1% and 100% density."""
    n = racks * per_rack if isinstance(per_rack, int) else sum(per_rack)
    with FabricCluster(racks=racks, per_rack=per_rack, spines=spines, faults=LOSSY,
                       nlanes=4) as f:
        assert f.job.nworkers == n > 32
        for density in (0.01, 1.0):
            ints = tensors(density, 30, n=1 << 16, nranks=n, integer=True)
            want = np.sum(ints, axis=0, dtype=np.int32)
            for r in f.allreduce(ints):
                assert np.array_equal(r, want)
            floats = tensors(density, 31, n=1 << 16, nranks=n)
            got = f.allreduce(floats)
            for r in got:
                assert r.tobytes() == got[0].tobytes()
            exact = np.sum(floats, axis=0, dtype=np.float64)
            # S = 30 - ceil(log2 N) - E: each of N values is off by at most 2**(E-30+6)/2.
            bound = n * 2.0 ** (np.ceil(np.log2(np.abs(np.concatenate(floats)).max())) - 25)
            assert np.abs(got[0] - exact).max() <= bound + 1e-6 * np.abs(exact).max()
        lost = [s.faults.dropped_in + s.faults.dropped_out for s in f.switches]
        assert min(lost) > 0, f"a switch lost nothing ({lost}): the test proved less"
        st = plan.status(f.plan, {f"leaf{i}": s for i, s in enumerate(f.leaves)}
                         | {f"spine{j}": s for j, s in enumerate(f.spines)})
        assert sorted(st["leaf"]) == [f"leaf{i}" for i in range(racks)]


def test_a_silent_worker_is_named_by_its_job_rank():
    """40 workers in 2 racks of 20; job rank 25 (rank 5 within rack 1) never calls. Its rack's
    agents time out naming rank 25 (their leaf's status names local ranks); rack 0's agents,
    whose leaf's status says the whole rack is in, name the other rack's ranks as "some of"."""
    with FabricCluster(racks=2, per_rack=20, timeout=2.0) as f:
        ints = tensors(1.0, 32, n=1 << 12, nranks=40, integer=True)
        futs = {r: f.pool.submit(f.agents[r].allreduce, ints[r]) for r in range(40) if r != 25}
        errors = {}
        for r, fut in futs.items():
            with pytest.raises(SpinaTimeout) as e:
                fut.result()
            errors[r] = e.value
    for r in range(20, 40):
        if r != 25:
            assert errors[r].missing == [25] and "ranks [25] never contributed" in str(
                errors[r]), str(errors[r])
    for r in range(20):
        assert errors[r].missing == list(range(20, 40)), str(errors[r])
        assert "every rank of this rack (0..19) contributed" in str(errors[r])


def test_slots_sharded_over_two_spines():
    """The job's slots split over two spines: each aggregates its own slots only, results
    exact."""
    with FabricCluster(spines=2) as f:
        ints = tensors(0.2, 3, integer=True)
        for r in f.allreduce(ints):
            assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
        slots = [{int(s) for s in np.flatnonzero(sp.pipeline.registers["slot_round"]) // 2}
                 for sp in f.spines]
        assert slots == [{0, 1}, {2, 3}]


def test_two_levels_with_loss_on_every_switch():
    """1% of datagrams lost into and out of every switch (leaves and spine), 1% duplicated, 1%
    reordered: results still exact and bit-identical on every rank, over several calls."""
    faults = lambda i: Faults(drop_in=0.01, drop_out=0.01, duplicate=0.01,  # noqa: E731
                              reorder=0.01, seed=i)
    with FabricCluster(faults=faults) as f:
        for call, density in enumerate((0.01, 1.0, 0.3)):
            ints = tensors(density, 10 + call, integer=True)
            for r in f.allreduce(ints):
                assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
            floats = tensors(density, 20 + call)
            got = f.allreduce(floats)
            for r in got:
                assert r.tobytes() == got[0].tobytes()
        lost = [s.faults.dropped_in + s.faults.dropped_out for s in f.switches]
        assert min(lost) > 0, f"a switch lost nothing ({lost}): the test proved less"


@pytest.mark.parametrize("density,shared", [(1.0, False), (0.01, True), (0.01, False)])
def test_spine_link_bytes_against_flat(density, shared):
    """Datagrams on the spine's links are exactly 1/(workers per rack) of a flat switch's;
    bytes too when the racks' non-zero blocks coincide (dense, or one sparsity pattern); with
    each rank its own sparse blocks, partials carry the union of a rack's blocks: more than a
    quarter, still less than flat. No loss here, and a 5 s timeout: nothing is resent."""
    ts = tensors(density, 4, shared=shared)
    with FabricCluster(rto=5.0) as f:
        f.allreduce(ts)
    two_level = f.spine_traffic()
    resends = sum(a.last_stats.resends for a in f.agents)
    _, one, flat_resends = flat(ts, rto=5.0)
    print(f"density {density} shared {shared}: spine links {two_level[0]} datagrams "
          f"{two_level[1]} bytes; flat {one[0]} datagrams {one[1]} bytes; ratio "
          f"{two_level[0] / one[0]:.4f} datagrams {two_level[1] / one[1]:.4f} bytes")
    assert resends == flat_resends == 0, "a loaded machine made agents resend: counts inexact"
    assert two_level[0] * 4 == one[0]
    if density == 1.0 or shared:
        assert two_level[1] * 4 == one[1]
    else:
        assert two_level[1] * 4 > one[1] and two_level[1] < one[1]


def test_a_new_epoch_on_every_level():
    """A new run (the controller's start_run, as `serve` calls it): every switch of both
    levels is re-admitted with the new epoch, slots cleared; agents reset to the new epoch sum
    exactly; an agent still on the old epoch is stale at its leaf and gets nothing."""
    with FabricCluster() as f:
        ints = tensors(0.3, 5, integer=True)
        f.allreduce(ints)
        new = f.start_run(2)
        assert all(s.pipeline.registers["slot_round"].sum() == 0 for s in f.switches)
        for a in f.agents:
            a.reset(new)
        for r in f.allreduce(ints):
            assert np.array_equal(r, np.sum(ints, axis=0, dtype=np.int32))
        stale = f.switches[0].pipeline.job_counters(7)["job_stale"]
        f.agents[0].close()  # rank 0's address, now with the old epoch
        old = Agent(dataclasses.replace(new, epoch=1), 0, f.plan.agent_switch("w0"),
                    timeout=0.3)
        with pytest.raises(SpinaTimeout):
            old.allreduce(np.ones(256, np.int32))
        old.close()
        assert f.switches[0].pipeline.job_counters(7)["job_stale"] > stale


def _restart_spine(f: FabricCluster, new: UdpSwitch) -> UdpSwitch:
    """`new`, on the stopped spine's port, takes its place: the controller installs the plan
    on it alone, as after a restart."""
    f.switches[2] = new
    f.spines = [new]
    program_in_process({"spine0": new.servicer()}, f.plan.state, ["spine0"])
    new.start()
    return new


def test_spine_restarted_mid_call():
    """The spine stops mid-call (its registers lost) and a new one starts on its port; the
    controller installs the plan on it alone; the call completes exactly on every rank."""
    with FabricCluster() as f:
        ints = tensors(1.0, 7, n=1 << 19, integer=True)  # 64 rounds per slot
        futs = [f.pool.submit(a.allreduce, t) for a, t in zip(f.agents, ints)]
        old = f.spines[0]
        deadline = time.monotonic() + 30
        while old.pipeline.registers["slot_round"].max() < 8 and time.monotonic() < deadline:
            time.sleep(0.001)
        old.stop()
        stopped_at = int(old.pipeline.registers["slot_round"].max())
        new = _restart_spine(f, UdpSwitch(*old.address))
        want = np.sum(ints, axis=0, dtype=np.int32)
        for fut in futs:
            assert np.array_equal(fut.result(), want)
        assert 8 <= stopped_at < 64, stopped_at  # the restart was mid-call
        assert new.pipeline.job_counters(7)["job_aggregated"] > 0


def test_spine_restarted_after_a_result_reached_one_leaf_only():
    """Leaf 1 loses the spine's results from round 8 on, and the spine stops right after the
    first such loss: that round's result is at leaf 0, whose workers never send it again, and
    missing at leaf 1. The restarted spine gets it back from leaf 0 (REPLAY) and the call
    completes exactly on every rank."""
    cut, stopped = threading.Event(), threading.Event()

    def lose_results(h: wire.Header) -> bool:
        if h.msg_type != wire.MSG_RESULT or h.round < 8 or stopped.is_set():
            return False
        cut.set()
        return True

    replays = []
    with FabricCluster(faults=lambda i: Faults(drop_in_match=lose_results) if i == 1 else None,
                       timeout=60) as f:
        ints = tensors(1.0, 7, n=1 << 19, integer=True)  # 64 rounds per slot
        futs = [f.pool.submit(a.allreduce, t) for a, t in zip(f.agents, ints)]
        assert cut.wait(30)
        old = f.spines[0]
        old.stop()
        stopped.set()
        count_replays = Faults(drop_in_match=lambda h: bool(
            h.flags & wire.FLAG_REPLAY and replays.append(h.slot)))  # counts, drops nothing
        _restart_spine(f, UdpSwitch(*old.address, faults=count_replays))
        want = np.sum(ints, axis=0, dtype=np.int32)
        for fut in futs:
            assert np.array_equal(fut.result(), want)
        assert replays, "no leaf replayed a result: the case was not reached"


def test_bounded_loss_flushes_cross_both_levels():
    """A worker's flush request completes its rack's round without the missing worker (the
    partial goes up marked partial and the spine's result says so); a flush request at a rack
    whose round is complete goes up as a flushing resend, and the spine completes its round
    without the missing rack."""
    flush = wire.FLAG_RESEND | wire.FLAG_PARTIAL
    l0, sp = leaf(0), spine()
    run(l0, RACK0[0], WORKER[0])
    up, to, _ = run(l0, patched(RACK0[0], flags=flush), WORKER[0])
    h = wire.unpack_header(up)
    assert (to, h.msg_type, h.flags & flush, h.bitmap) == (
        TO_UPSTREAM, wire.MSG_CONTRIB, wire.FLAG_PARTIAL, 0b01)
    run(sp, up, LEAF[0])
    result, to, _ = run(sp, PARTIAL1, LEAF[1])
    assert to == TO_GROUP and wire.unpack_header(result).flags & wire.FLAG_PARTIAL
    # Rack 0 complete and sent up; rack 1 never arrives: a flush goes up and completes it.
    (l0, _), (up0, _) = completed_leaves()
    sp = spine()
    run(sp, up0[0], LEAF[0])
    again, to, _ = run(l0, patched(RACK0[1], flags=wire.FLAG_LAST | flush), WORKER[1])
    assert to == TO_UPSTREAM and wire.unpack_header(again).flags & flush == flush
    result, to, key = run(sp, again, LEAF[0])
    h = wire.unpack_header(result)
    assert (to, key, h.bitmap, h.flags & wire.FLAG_PARTIAL) == (TO_GROUP, 1, 0b01,
                                                                 wire.FLAG_PARTIAL)
    down, _, _ = run(l0, result, SPINE)
    assert wire.unpack_header(down).bitmap == 0b0011


# ---------------------------------------------------------------- P4 tables through the controller
def l2_doc(epoch: int = 1) -> dict:
    """2 racks of 2 workers on L2-mode software switches leaf0, leaf1 (workers on ports 1, 2,
    the spine on port 9), spine0 (leaf0 on port 1, leaf1 on port 2); job 7 in P4 sizes."""
    sws = [("leaf0", "10.0.1.1"), ("leaf1", "10.0.1.2"), ("spine0", "10.0.2.1")]
    return {
        "switches": [{"name": n, "target": "softswitch", "grpc": "in-process", "address": a,
                      "ports": [1, 2] if n == "spine0" else [1, 2, 9]} for n, a in sws],
        "workers": [{"name": f"w{r}", "ip": f"10.0.0.{r + 1}", "udp_port": 50000 + r,
                     "switch_port": r % 2 + 1, "mac": f"02:00:00:00:01:{r:02x}",
                     "switch": f"leaf{r // 2}"} for r in range(4)],
        "fabric": {
            "racks": [{"name": f"r{i}", "leaf": f"leaf{i}", "workers": [f"w{2 * i}",
                                                                       f"w{2 * i + 1}"]}
                      for i in range(2)],
            "spines": ["spine0"],
            "jobs": [{"id": 7, "racks": ["r0", "r1"], "slot_base": 0, "nslots": 2,
                      "block_size": 32, "nlanes": 4, "epoch": epoch,
                      "shards": [{"spine": "spine0", "slot_base": 0, "nslots": 2}]}],
            "links": [{"leaf": f"leaf{i}", "leaf_port": 9, "leaf_mac": f"02:00:00:00:02:{i:02x}",
                       "spine": "spine0", "spine_port": i + 1, "spine_mac": "02:00:00:00:03:00"}
                      for i in range(2)]}}


def test_p4_rows_of_a_leaf_and_a_spine():
    """The plan as P4 rows: the leaf admits its rack's workers by local rank (0, 1; their
    replication ids too), job_level as_leaf and one leaf_upstream row per slot; the spine
    admits the leaves by their address and link port."""
    f = plan.parse(l2_doc())
    rows = plan.p4_rows(f, "leaf1")
    (level,) = [r for r in rows.entries if r[0] == "job_level"]
    assert level == ("job_level", {"job": 7}, "as_leaf",
                     {"rack": 1, "nlocal": 2, "epoch": 1, "mcast_grp": 8})
    adm = [(r[1]["src_addr"], r[1]["rank"], r[3]["nworkers"]) for r in rows.entries
           if r[0] == "admission"]
    assert adm == [("10.0.0.3", 0, 2), ("10.0.0.4", 1, 2)]
    ups = [r[1:] for r in rows.entries if r[0] == "leaf_upstream"]
    assert ups == [({"job": 7, "slot": s}, "to_spine", {"port": 9, "dst_mac": "02:00:00:00:03:00",
                                                        "dst_addr": "10.0.2.1"}) for s in (0, 1)]
    assert rows.groups == {8: [(1, 7 * 32 + 1), (2, 7 * 32 + 2)]}
    spine = plan.p4_rows(f, "spine0")
    adm = [(r[1]["ingress_port"], r[1]["src_addr"], r[1]["src_port"], r[1]["rank"],
            r[3]["nworkers"]) for r in spine.entries if r[0] == "admission"]
    assert adm == [(1, "10.0.1.1", 47000, 0, 2), (2, "10.0.1.2", 47000, 1, 2)]
    assert ("job_level", {"job": 7}, "as_spine", {}) in spine.entries
    doc = l2_doc()
    doc["fabric"]["links"].pop()
    with pytest.raises(ConfigError, match=r"^fabric.links: no link between leaf 'leaf1'"):
        plan.p4_rows(plan.parse(doc), "leaf1")


class L2Fabric:
    """leaf0, leaf1, spine0 of l2_doc as softswitch.dataplane.Dataplanes, each behind its P4Runtime
    servicer in process, programmed by the controller's SwitchSession.apply from the desired
    state's fabric section; frames between them carried here."""

    def __init__(self, doc):
        from controller.p4rt import Connection
        from controller.registers import P4RuntimeRegisters
        from softswitch.dataplane import Dataplane
        from softswitch.p4runtime_server import SoftSwitchServicer
        from spina import spec
        self.fabric = plan.parse(doc)
        self.dps, self.conns, self.regs = {}, {}, {}
        for name in ("leaf0", "leaf1", "spine0"):
            self.dps[name] = Dataplane()
            c = Connection.in_process(SoftSwitchServicer(self.dps[name]))
            c.set_pipeline(spec.p4info(), b"", cookie=1)
            self.conns[name], self.regs[name] = c, P4RuntimeRegisters(c)
        self.links = {("leaf0", 9): ("spine0", 1), ("leaf1", 9): ("spine0", 2)}
        self.links.update({v: k for k, v in self.links.items()})
        self.crossed = 0  # frames on the spine's links

    def install(self, fabric=None):
        """{switch: (deletes, inserts + modifies, [(job, slot_base, nslots) cleared])}."""
        from controller.controller import SwitchSession
        state = (fabric or self.fabric).state
        out = {}
        for n, c in self.conns.items():
            r = SwitchSession(state.switches[n], registers=self.regs[n], conn=c).apply(state)
            out[n] = (r.deletes, r.inserts + r.modifies, r.cleared)
        return out

    def send(self, rank: int, payload: bytes) -> dict[int, list[bytes]]:
        """Worker `rank`'s INA payload into its leaf; every frame that reaches a worker."""
        from scapy.layers.inet import IP, UDP
        from scapy.layers.l2 import Ether
        leaf = f"leaf{rank // 2}"
        frame = bytes(Ether(src=f"02:00:00:00:01:{rank:02x}", dst="02:00:00:00:02:00")
                      / IP(src=f"10.0.0.{rank + 1}", dst=f"10.0.1.{rank // 2 + 1}")
                      / UDP(sport=50000 + rank, dport=47000) / payload)
        todo, got = [(leaf, rank % 2 + 1, frame)], {}
        while todo:
            sw, port, fr = todo.pop(0)
            for eport, out in self.dps[sw].process(fr, port, now=0.0):
                if (sw, eport) in self.links:
                    self.crossed += 1
                    todo.append((*self.links[(sw, eport)], out))
                else:
                    got.setdefault(2 * int(sw[-1]) + eport - 1, []).append(out)
        return got


def test_plan_installed_on_l2_switches_aggregates_in_two_levels():
    """The controller's apply programs two leaves and a spine (L2-mode software switches,
    through the controller's P4Runtime client); four workers' contributions come back to every
    worker as one result each, equal to one flat switch's (but for the header's rank: the last
    sender's at the spine, and the bitmap: the rack's local ranks), with 2 partials up and 2
    results down on the spine's links. Installing again writes nothing; a new epoch clears the
    job's slots on every switch."""
    from spina.config import WorkerAddr as W
    fab = L2Fabric(l2_doc())
    counts = fab.install()
    assert counts["leaf0"][2] == [(7, 0, 2)] and counts["spine0"][2] == [(7, 0, 2)]
    rng = np.random.default_rng(5)
    payloads = []
    for r in range(4):
        present = int(rng.integers(0, 16))
        n = bin(present).count("1")
        h = header(rank=r % 2, slot=1, round=5, epoch=1, job=7, nlanes=4, block_size=32,
                   present=present, exponent=int(rng.integers(-5, 5)), flags=wire.FLAG_LAST)
        data = rng.integers(-2**31, 2**31, (n, 32), dtype=np.int64).astype(np.int32)
        payloads.append(wire.pack(h, rng.integers(0, 50, 4).astype(np.uint32),
                                  data if n else None))
    got = {}
    for r, pl in enumerate(payloads):
        for w, frames in fab.send(r, pl).items():
            got.setdefault(w, []).extend(frames)
    flat_pipe = Pipeline(pool_slots=4, slot_capacity=4 * 32)
    flat_pipe.add_job(JobConfig(job=7, workers=tuple(W(r, f"10.0.0.{r + 1}", 50000 + r)
                                                     for r in range(4)), slot_base=0, nslots=2,
                                nlanes=4, block_size=32, epoch=1),
                      {r: (0, (f"10.0.0.{r + 1}", 50000 + r)) for r in range(4)})
    for r, pl in enumerate(payloads):
        emits = flat_pipe.process(patched(pl, rank=r), 0, (f"10.0.0.{r + 1}", 50000 + r))
    want = patched(emits[0].data, rank=1, bitmap=0b11)
    assert sorted(got) == [0, 1, 2, 3]
    for w, frames in got.items():
        assert len(frames) == 1
        f = frames[0]
        assert f[42:] == want
        assert (f[30:34], f[36:38]) == (bytes([10, 0, 0, w + 1]), (50000 + w).to_bytes(2, "big"))
    assert fab.crossed == 4
    for name, dp in fab.dps.items():
        assert dp.counter("job_results", 7) == 2, name
    assert fab.install() == {n: (0, 0, []) for n in fab.conns}
    counts = fab.install(plan.parse(l2_doc(epoch=2)))
    assert all(c[2] == [(7, 0, 2)] for c in counts.values())
    assert all(dp.register("slot_count", 3) == 0 for dp in fab.dps.values())


def test_controller_deploys_a_fabric_beside_a_flat_job(tmp_path):
    """One desired state with a flat job (9, on leaf0 only) and the fabric's job 7: the
    controller's deploy installs both on every switch, writes each rank an assignment naming
    its own leaf, and a second deploy writes nothing; status names each switch's level. A state
    without the fabric section removes the fabric's rows and clears its slots but keeps job 9;
    wipe empties the role tables too."""
    from controller.controller import Controller
    from controller.state import parse
    from spina.config import Assignment
    doc = l2_doc()
    doc["agents_dir"] = str(tmp_path)
    doc["jobs"] = [{"id": 9, "members": ["w0", "w1"], "slot_base": 2, "nslots": 2,
                    "block_size": 32, "nlanes": 4}]
    fab = L2Fabric(doc)
    state = parse(doc)
    assert state.fabric is not None and sorted(state.jobs) == [9]

    def rows(name, table):
        return len(fab.conns[name].read_table(table))

    ctl = Controller(state, registers=fab.regs, connect=lambda sw: fab.conns[sw.name])
    reps = {r.switch: r for r in ctl.deploy()}
    assert reps["leaf0"].cleared == [(7, 0, 2), (9, 2, 2)]
    assert reps["leaf1"].cleared == reps["spine0"].cleared == [(7, 0, 2)]
    assert [(n, rows(n, "admission"), rows(n, "job_level"), rows(n, "leaf_upstream"))
            for n in ("leaf0", "leaf1", "spine0")] == [("leaf0", 4, 1, 2), ("leaf1", 2, 1, 2),
                                                      ("spine0", 2, 1, 0)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "job7-rank0.json", "job7-rank1.json", "job7-rank2.json", "job7-rank3.json",
        "job9-rank0.json", "job9-rank1.json", "job9.json"]
    a = Assignment.load(tmp_path / "job7-rank2.json")
    assert (a.rank, a.switch[0], len(a.job.workers)) == (2, "10.0.1.2", 4)
    assert not any(r.changed for r in ctl.deploy())

    st = {(r["switch"], r["job"]): (r["level"], r["slots"], r["workers"], r["installed"])
          for r in ctl.status()}
    assert st == {("leaf0", 9): ("flat", "2..3", 2, "yes"),
                  ("leaf0", 7): ("leaf", "0..1", 2, "yes"),
                  ("leaf1", 7): ("leaf", "0..1", 2, "yes"),
                  ("spine0", 7): ("spine", "0..1", 2, "yes")}

    flat_doc = {k: v for k, v in doc.items() if k != "fabric"}
    reps = {r.switch: r for r in ctl.set_state(parse(flat_doc))}
    assert reps["leaf0"].cleared == [(7, 0, 2)] and reps["spine0"].cleared == [(7, 0, 2)]
    assert [(rows(n, "admission"), rows(n, "job_level"), rows(n, "leaf_upstream"))
            for n in ("leaf0", "leaf1", "spine0")] == [(2, 0, 0), (0, 0, 0), (0, 0, 0)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "job9-rank0.json", "job9-rank1.json", "job9.json"]

    ctl.set_state(state)
    assert rows("leaf0", "job_level") == 1
    ctl.wipe()
    assert all(rows(n, t) == 0 for n in fab.conns for t in ("admission", "job_level",
                                                             "leaf_upstream", "worker_rewrite"))
    ctl.close()


def test_fabric_plan_needs_the_role_tables():
    """A switch whose P4 program lacks the leaf/spine tables is refused by name, not with a
    KeyError from deep inside the controller."""
    from controller import controls
    from controller.state import parse

    class NoRoles:
        def has(self, kind, name):
            return name not in ("job_level", "leaf_upstream")

    class Conn:
        index = NoRoles()

    state = parse(l2_doc())
    with pytest.raises(ConfigError, match=r"^switches\.leaf0\.p4info: the program has no "
                                          r"table 'job_level'"):
        controls.FabricRoles(Conn()).entries(state, state.switches["leaf0"])


def test_slot_groups_round_trip_and_bad_values_name_the_field():
    """JobConfig.slot_groups (each slot's spine) travels in job and assignment files; a wrong
    length, a non-integer or a non-list is refused naming the field."""
    from spina.config import ConfigError, JobConfig, job_to_dict
    f = plan.parse(fabric_doc())
    cfg = f.job_config(f.jobs[7])
    d = job_to_dict(cfg)
    assert d["slot_groups"] == [0, 0, 1, 1]
    assert JobConfig.from_dict(d) == cfg
    flat = job_to_dict(dataclasses.replace(cfg, slot_groups=()))
    assert "slot_groups" not in flat and JobConfig.from_dict(flat).slot_groups == ()
    for bad, why in (([0, 1], "one group per slot: 2 groups for 4 slots"),
                     ([0, 0, 1, "1"], "groups must be integers in 0..255"),
                     ([0, 0, 1, 256], "groups must be integers in 0..255"),
                     ("0011", "must be a list of integers")):
        with pytest.raises(ConfigError, match=f"field 'slot_groups': {why}"):
            JobConfig.from_dict(dict(d, slot_groups=bad))
