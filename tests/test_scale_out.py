"""Two-level (leaf, spine) aggregation on the software switch: the controller's fabric plan,
the leaf and spine roles packet by packet, and 8 workers in 2 racks end to end
(docs/scale_out.md; software switch only, the P4 roles come later).

Run just this file: python -m pytest tests/test_scale_out.py
"""
from __future__ import annotations

import pytest
import yaml

from controller import plan
from spina.config import ConfigError


# ---------------------------------------------------------------- the plan
def fabric_doc(racks=2, per_rack=4, spines=2, nslots=4, base_port=47001, worker_port=50000,
               host="127.0.0.1") -> dict:
    """A desired state with a fabric: racks r<i> on leaf<i>, spines spine<j>, job 7 sharded
    evenly over the spines."""
    switches = [{"name": f"leaf{i}", "target": "softswitch", "grpc": "in-process",
                 "address": host, "udp_port": base_port + i} for i in range(racks)]
    switches += [{"name": f"spine{j}", "target": "softswitch", "grpc": "in-process",
                  "address": host, "udp_port": base_port + racks + j} for j in range(spines)]
    workers = [{"name": f"w{r * per_rack + k}", "ip": host,
                "udp_port": worker_port + r * per_rack + k, "switch_port": 0,
                "switch": f"leaf{r}"} for r in range(racks) for k in range(per_rack)]
    share = nslots // spines
    shards = [{"spine": f"spine{j}", "slot_base": j * share,
               "nslots": share if j < spines - 1 else nslots - j * share} for j in range(spines)]
    return {"switches": switches, "workers": workers, "fabric": {
        "racks": [{"name": f"r{i}", "leaf": f"leaf{i}",
                   "workers": [f"w{i * per_rack + k}" for k in range(per_rack)]}
                  for i in range(racks)],
        "spines": [f"spine{j}" for j in range(spines)],
        "jobs": [{"id": 7, "racks": [f"r{i}" for i in range(racks)], "slot_base": 0,
                  "nslots": nslots, "block_size": 4, "nlanes": 2, "shards": shards}]}}


def test_plan_levels_ranks_and_shards():
    """A valid plan: one level per switch, ranks rack by rack, each spine admits its shard with
    the leaves as workers, each leaf its rack with the spines' addresses per slot range."""
    f = plan.parse(fabric_doc())
    assert f.levels == {"leaf0": "leaf", "leaf1": "leaf", "spine0": "spine", "spine1": "spine"}
    job = f.jobs[7]
    assert f.members(job) == tuple(f"w{i}" for i in range(8))
    cfg = f.job_config(job)
    assert [(w.rank, w.port) for w in cfg.workers] == [(r, 50000 + r) for r in range(8)]
    assert f.agent_switch("w5") == ("127.0.0.1", 47002)
    (s0,) = f.spine_jobs("spine0")
    (s1,) = f.spine_jobs("spine1")
    assert (s0.slot_base, s0.nslots, s1.slot_base, s1.nslots) == (0, 2, 2, 2)
    assert [(w.rank, w.port) for w in s1.workers] == [(0, 47001), (1, 47002)]
    (lj,) = f.leaf_jobs("leaf1")
    assert (lj.rack_sizes, lj.rack) == ((4, 4), 1)
    assert lj.upstream == ((0, 2, ("127.0.0.1", 47003)), (2, 2, ("127.0.0.1", 47004)))
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


def test_plan_more_than_32_workers_in_a_job_is_refused_for_now():
    """3 racks of 11 workers: each rack is fine, the job's 33 ranks do not fit the wire yet."""
    with pytest.raises(ConfigError, match=r"^fabric.jobs\[0\].racks: 33 workers"):
        plan.parse(fabric_doc(racks=3, per_rack=11, spines=1))


def test_plan_load_names_the_file(tmp_path):
    """plan.load reads YAML; a wrong field is reported with the file's path."""
    good = tmp_path / "fabric.yaml"
    good.write_text(yaml.safe_dump(fabric_doc()))
    assert sorted(plan.load(good).jobs) == [7]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_edit(lambda d: d["fabric"]["racks"][0].pop("leaf"))))
    with pytest.raises(ConfigError, match=rf"^{bad}: fabric.racks\[0\].leaf: "):
        plan.load(bad)
