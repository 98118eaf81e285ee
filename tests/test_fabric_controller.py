"""The fabric plan as P4 rows (spina.rows) installed through the controller: on L2-mode
software switches, beside a flat job, and refused where the role tables are missing.

Run just this file: python -m pytest tests/test_fabric_controller.py
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench.scale_out import fabric_doc
from controller import plan
from softswitch.dataplane import Dataplane
from softswitch.pipeline import Pipeline
from spina import wire
from spina.config import Assignment, ConfigError, JobConfig
from tests.fabric_packets import header, patched


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
    for dp in fab.dps.values():  # cells a wipe must zero, inside the pool and past it
        dp.pipeline.registers["slot_count"][[3, 200]] = 5
        dp.pipeline.registers["slot_values"][3, 7] = -9
    ctl.wipe()
    assert all(rows(n, t) == 0 for n in fab.conns for t in ("admission", "job_level",
                                                             "leaf_upstream", "worker_rewrite"))
    assert all(dp.register("slot_count", i) == 0 for dp in fab.dps.values() for i in (3, 200))
    assert all(not dp.pipeline.registers["slot_values"].any() for dp in fab.dps.values())
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
        leaf = state.switches["leaf0"]
        controls.FabricRoles(Conn()).entries(state, leaf, controls.job_rows(state, leaf))


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
