"""Two-level (leaf, spine) aggregation: the controller's fabric plan (controller/plan.py):
levels, ranks and shards, every wrong field named, rack assignments (docs/scale_out.md).

Run just this file: python -m pytest tests/test_fabric_plan.py
"""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from bench.scale_out import fabric_doc
from controller import plan, tofino
from spina import rows as switch_rows, spec
from spina.config import Assignment, ConfigError, JobConfig, JobFile, load_worker_file


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


def _tofino(name, p4info="p4info.txtpb"):
    """Switch `name` becomes a tofino switch whose P4Info is `p4info` (a missing file here)."""
    def edit(doc):
        sw = next(s for s in doc["switches"] if s["name"] == name)
        sw.update(target="tofino", grpc="127.0.0.1:9559", p4info=str(p4info), udp_port=47000,
                  device_config="out", device_config_format="stratum")
        for i, w in enumerate(doc["workers"]):
            if w["switch"] == name:
                w["mac"] = f"02:00:00:00:00:{i:02x}"
    return edit


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
    # Issue 28: a tofino leaf or spine needs a TNA program with the roles, which the plan
    # reads in its P4Info (test_a_tofino_leaf_or_spine_needs_a_program_with_the_roles).
    (_tofino("leaf0"), "fabric.racks[0].leaf",
     "the plan cannot tell whether its TNA program has the leaf role"),
    (_tofino("spine1"), "fabric.spines[1]",
     "the plan cannot tell whether its TNA program has the spine role"),
]


@pytest.mark.parametrize("edit,field,words", WRONG_PLANS)
def test_wrong_plan_names_the_field(edit, field, words):
    """Each wrong plan is rejected with an error that names the offending field."""
    with pytest.raises(ConfigError) as e:
        plan.parse(_edit(edit))
    assert str(e.value).startswith(f"{field}: ") and words in str(e.value), str(e.value)


# bf-p4c's P4Info of the Tofino 2 profile with the roles and the hold (tofino/README.md).
T2NA_ROLES = (pathlib.Path(__file__).resolve().parents[1]
              / "tofino/build/spina_t2na_roles.std.p4info.txtpb")


def _p4info_file(path):
    """The TNA program's P4Info (spec.tna_p4info: what bf-p4c declares) written to `path`."""
    path.write_text(text_format.MessageToString(spec.tna_p4info()))
    return path


@pytest.mark.parametrize("switch,field,role", [("leaf0", "fabric.racks[0].leaf", "leaf"),
                                               ("spine1", "fabric.spines[1]", "spine")])
def test_a_tofino_leaf_or_spine_needs_a_program_with_the_roles(tmp_path, switch, field, role):
    """Issue 28: the plan reads a tofino switch's P4Info. The TNA program (no job_level or
    leaf_upstream table) is refused as a leaf or spine, naming the field, the file and why;
    the Tofino 2 profile's committed P4Info, which declares both tables, is taken, and a tofino
    leaf's jobs must have the TNA block size; its as_leaf row is written with the parameters
    that P4Info declares (spina/rows.py program_params)."""
    tna = _p4info_file(tmp_path / "spina_tna.p4info.txtpb")
    with pytest.raises(ConfigError) as e:
        plan.parse(_edit(_tofino(switch, tna)))
    assert str(e.value) == (
        f"{field}: switch {switch!r} is a tofino switch, and its TNA program ({tna}) has no "
        f"{role} role: its P4Info declares no job_level / leaf_upstream tables ("
        f"{tofino.NO_ROLES})")
    roles = T2NA_ROLES
    f = plan.parse(_edit(_tofino(switch, roles)))
    assert f.levels[switch] == role
    with pytest.raises(ConfigError) as e:
        plan.p4_rows(f, switch)
    assert str(e.value) == ("fabric.jobs[0].block_size: the tofino P4 program aggregates "
                            f"blocks of {spec.TNA_SIZES['BLOCK_SIZE']}")

    def tna_job(doc):
        _tofino(switch, roles)(doc)
        doc["fabric"]["jobs"][0].update(block_size=spec.TNA_SIZES["BLOCK_SIZE"], nlanes=1)
        doc["fabric"]["links"] = [  # a P4 switch's rows name each link's ports and MACs
            {"leaf": f"leaf{a}", "leaf_port": 10 + b, "leaf_mac": f"02:00:00:00:0{a}:0{b}",
             "spine": f"spine{b}", "spine_port": 20 + a, "spine_mac": f"02:00:00:00:1{b}:0{a}"}
            for a in range(2) for b in range(2)]
        for sw in doc["switches"]:
            sw["ports"] = sorted({*sw.get("ports", [0]), 0, 10, 11, 20, 21})
    rows = plan.p4_rows(plan.parse(_edit(tna_job)), switch)
    (level,) = rows.table("job_level")
    assert level[1] == f"as_{role}"
    info = text_format.Parse(roles.read_text(), p4info_pb2.P4Info())
    (action,) = [a for a in info.actions if a.preamble.name == level[1]]
    got = switch_rows.program_params(level[1], level[2], [p.name for p in action.params])
    rack = 0 if switch == "leaf0" else None
    nlocal = len(_edit(tna_job)["fabric"]["racks"][0]["workers"])
    assert got == ({"rack": rack, "rack_bit": 1 << rack, "all_local": (1 << nlocal) - 1,
                    "epoch": 1} if role == "leaf" else {})


@pytest.mark.parametrize("switch,field,role,action", [
    ("leaf0", "fabric.racks[0].leaf", "leaf", "as_leaf"),
    ("spine1", "fabric.spines[1]", "spine", "as_spine")])
def test_a_tofino_role_whose_action_the_rows_cannot_fill_is_refused(tmp_path, switch, field,
                                                                     role, action):
    """Issue 46 item 3: a tofino leaf or spine whose P4Info's job_level action takes a
    parameter the plan's rows neither have nor derive, or that lacks the action, is refused
    in one line naming the field, the switch, the action and the parameter."""
    info = text_format.Parse(T2NA_ROLES.read_text(), p4info_pb2.P4Info())
    (a,) = [x for x in info.actions if x.preamble.name == action]
    a.params.add(id=9, name="spine_epoch", bitwidth=16)
    odd = tmp_path / "odd.p4info.txtpb"
    odd.write_text(text_format.MessageToString(info))
    with pytest.raises(ConfigError) as e:
        plan.parse(_edit(_tofino(switch, odd)))
    assert str(e.value) == (
        f"{field}: switch {switch!r} is a tofino switch, and its TNA program's action "
        f"{action!r} ({odd}) takes parameter 'spine_epoch', which the plan's rows neither "
        "have nor derive (spina/rows.py DERIVED_PARAMS)")
    a.preamble.name = f"{action}_renamed"
    odd.write_text(text_format.MessageToString(info))
    with pytest.raises(ConfigError) as e:
        plan.parse(_edit(_tofino(switch, odd)))
    assert str(e.value) == (
        f"{field}: switch {switch!r} is a tofino switch, and its TNA program ({odd}) declares "
        f"no action {action!r}, which the {role} role's rows name")


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
