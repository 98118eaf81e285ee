"""The L2-mode software switch's control plane and CLI (the packet behaviour is in bmv2_tests/).

Run just this file: python -m pytest tests/test_l2_dataplane.py
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from controller.controller import program_in_process
from controller.softswitch_files import from_l2_config
from softswitch.dataplane import Dataplane, ipv4_checksum
from softswitch.p4runtime_server import SoftSwitchServicer
from spina import spec
from spina.config import ConfigError


def configure(dp: Dataplane, cfg: dict) -> None:
    """What `python -m softswitch l2 --config` does: the controller programs the Dataplane."""
    program_in_process(SoftSwitchServicer(dp), from_l2_config(
        cfg, pool_slots=dp.pipeline.pool_slots, slot_capacity=dp.pipeline.slot_capacity))

CFG = {"endpoints": ["10.0.0.100"],
       "l2": [{"mac": "02:00:00:00:01:00", "port": 1}],
       "routes": [{"prefix": "10.1.0.0/16", "port": 3, "src_mac": "02:00:00:00:00:fe",
                   "dst_mac": "02:00:00:00:00:fd"}],
       "qdepth_threshold": 9,
       "jobs": [{"job": 3, "nslots": 4, "block_size": 32, "nlanes": 4, "bounded_loss": 0.1,
                 "workers": [{"host": "10.0.0.1", "port": 50000, "mac": "02:00:00:00:01:00",
                              "switch_port": 1},
                             {"host": "10.0.0.2", "port": 50001, "mac": "02:00:00:00:01:01",
                              "switch_port": 2}]}]}


def test_configure_fills_every_table():
    """A switch config becomes endpoint, l2 (the config's and each worker's MAC), route,
    congestion (the job's bound with the switch's threshold), admission, group and rewrites,
    with the controller's group and rid numbers."""
    dp = Dataplane()
    configure(dp, CFG)
    assert dp.ina_endpoint == {bytes([10, 0, 0, 100])}
    assert dp.l2 == {bytes.fromhex("020000000100"): 1, bytes.fromhex("020000000101"): 2}
    assert list(dp.ipv4_routes.values())[0].port == 3
    assert dp.congestion.table == {3: (9, spec.loss_bound(0.1))}
    assert dp.mcast_groups == {spec.mcast_grp(3): [(1, spec.rid(3, 0)), (2, spec.rid(3, 1))]}
    assert dp.worker_rewrite[spec.rid(3, 1)] == (bytes.fromhex("020000000101"),
                                                 bytes([10, 0, 0, 2]), 50001)
    assert set(dp.pipeline.admission) == {(1, ("10.0.0.1", 50000), 3, 0),
                                          (2, ("10.0.0.2", 50001), 3, 1)}
    adm = dp.pipeline.admission[(2, ("10.0.0.2", 50001), 3, 1)]
    assert (adm.nworkers, adm.mcast_grp, adm.nlanes, adm.nslots) == (2, spec.mcast_grp(3), 4, 4)


def test_configure_without_endpoints_forwards_only():
    """A switch config without endpoints (a leaf) gets no ina_endpoint entry; without a job
    that has a loss bound its threshold alone installs no congestion entry (never drops)."""
    dp = Dataplane()
    configure(dp, {"l2": [{"mac": "02:00:00:00:01:00", "port": 1}], "qdepth_threshold": 5})
    assert (dp.ina_endpoint, dp.l2, dp.congestion.table) == \
        (set(), {bytes.fromhex("020000000100"): 1}, {})


def test_configure_errors_name_the_field():
    """Unknown fields, workers without a switch port and one address with two MACs are
    reported by name."""
    with pytest.raises(ConfigError, match="field 'bogus': unknown field"):
        configure(Dataplane(), {"bogus": 1})
    bad = {"jobs": [dict(CFG["jobs"][0], workers=[{"host": "10.0.0.1", "port": 1, "mac": "x"}])]}
    with pytest.raises(ConfigError, match="jobs.0..workers.0..switch_port"):
        configure(Dataplane(), bad)
    two = dict(CFG["jobs"][0], job=4, slot_base=4)
    two["workers"] = [dict(two["workers"][0], mac="02:00:00:00:09:09"), two["workers"][1]]
    with pytest.raises(ConfigError, match=r"jobs\[1\]\.workers\[0\]: 10.0.0.1:50000 is also"):
        configure(Dataplane(), dict(CFG, jobs=CFG["jobs"] + [two]))


def test_configured_spray_sends_round_robin():
    """A config l2 entry with ports sprays its MAC's frames over them in turn, byte for byte,
    while the other entries bridge; the controller's group 0 turn register follows."""
    dp = Dataplane()
    configure(dp, {"l2": [{"mac": "02:00:00:00:01:00", "port": 1},
                          {"mac": "02:00:00:00:02:01", "ports": [3, 2, 4]}]})
    sprayed = [bytes.fromhex("020000000201020000000100") + b"\x88\xb5" + bytes([i]) * 50
               for i in range(5)]
    out = [dp.process(f, 1) for f in sprayed]
    assert out == [[(3, sprayed[0])], [(2, sprayed[1])], [(4, sprayed[2])], [(3, sprayed[3])],
                   [(2, sprayed[4])]]
    assert dp.register("spray_turn", 0) == 2
    bridged = bytes.fromhex("020000000100020000000201") + b"\x88\xb5" + bytes(50)
    assert dp.process(bridged, 3) == [(1, bridged)]


def test_table_add_checks_names():
    """Tables, actions, keys and parameters are checked against spina/spec.py."""
    dp = Dataplane()
    with pytest.raises(KeyError, match="no table"):
        dp.table_add("nope", {}, "bridge", {})
    with pytest.raises(KeyError, match="no action"):
        dp.table_add("l2", {"dst_mac": 1}, "route", {})
    with pytest.raises(KeyError, match="needs keys"):
        dp.table_add("l2", {"mac": 1}, "bridge", {"port": 1})
    with pytest.raises(KeyError, match="needs parameters"):
        dp.table_add("l2", {"dst_mac": 1}, "bridge", {})


def test_table_dispatch_covers_every_table():
    """table_add's dispatch holds exactly spec's tables; an unknown table is a KeyError naming
    it and the known ones, on add and on delete."""
    assert list(Dataplane.TABLE_HANDLERS) == list(spec.TABLES)
    dp = Dataplane()
    for call in (lambda: dp.table_add("l3", {}, "bridge", {}), lambda: dp.table_delete("l3", {})):
        with pytest.raises(KeyError, match=r"no table 'l3' \(tables: ina_endpoint, admission, "):
            call()
    dp.table_add("l2", {"dst_mac": 5}, "bridge", {"port": 2})
    dp.table_delete("l2", {"dst_mac": 5})
    assert (dp.l2, dp.version) == ({}, 2)


def test_register_names_map_onto_arrays():
    """P4 register names read the pipeline's arrays (value lanes at the P4 block size)."""
    dp = Dataplane()
    bs = spec.P4_SIZES["BLOCK_SIZE"]
    dp.registers["slot_values"][3, 2 * bs + 5] = -1
    dp.registers["slot_next"][3, 1] = 77
    dp.registers["slot_exponent"][3] = -2
    assert dp.register("slot_values_l2_e5", 3) == 0xFFFFFFFF
    assert dp.register("slot_next_l1", 3) == 77
    assert dp.register("slot_exponent", 3) == 0xFFFE


def test_ipv4_checksum_known_value():
    """RFC 1071 example header checksums to the known value."""
    hdr = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert ipv4_checksum(hdr) == 0xB861


@pytest.mark.parametrize("mode", ["udp", "l2"])
def test_cli_help(mode):
    """`python -m softswitch <mode> --help` works and describes the mode, and its choice of
    data path (compiled by default)."""
    out = subprocess.run([sys.executable, "-m", "softswitch", mode, "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert f"python -m softswitch {mode}" in out
    assert "--datapath {compiled,python}" in out and "Default compiled" in " ".join(out.split())


def test_datapath_is_checked():
    """A Dataplane's data path is one of DATAPATHS; the L2 mode's compiled one is the default
    (the UDP mode's Dataplane has none: UdpSwitch runs its own)."""
    with pytest.raises(ValueError, match="datapath 'fast': one of compiled, python"):
        Dataplane(datapath="fast")
    assert Dataplane().compiled is not None and Dataplane(datapath="python").compiled is None
    assert Dataplane(udp_mode=True).compiled is None


def test_job_larger_than_mtu_refused():
    """L2 mode refuses a job whose full packets do not fit the links' MTU, naming nlanes."""
    cfg = dict(CFG, jobs=[dict(CFG["jobs"][0], nlanes=16, block_size=256)])
    with pytest.raises(ConfigError, match="jobs.0.: field 'nlanes'.*MTU of 1500"):
        configure(Dataplane(), cfg)
    configure(Dataplane(), dict(cfg, mtu=65000))


def test_udp_jobs_are_written_by_the_controller():
    """`udp --jobs`: the controller admits each job on port 0 from its workers' addresses, and
    results reach every worker's address through the job's group and worker_rewrite."""
    from softswitch.__main__ import program_udp_jobs
    from softswitch.udp import UdpSwitch
    from spina.config import JobConfig, WorkerAddr
    job = JobConfig(job=6, workers=(WorkerAddr(0, "127.0.0.1", 50010),
                                    WorkerAddr(1, "127.0.0.2", 50011)),
                    slot_base=2, nslots=2, block_size=8, nlanes=2)
    sw = UdpSwitch("127.0.0.1", 0, pool_slots=8, slot_capacity=64)
    try:
        program_udp_jobs(sw, [job], "jobs.yaml")
        assert set(sw.pipeline.admission) == {(0, ("127.0.0.1", 50010), 6, 0),
                                              (0, ("127.0.0.2", 50011), 6, 1)}
        assert sw.destinations() == {spec.mcast_grp(6): [("127.0.0.1", 50010),
                                                         ("127.0.0.2", 50011)]}
        assert sw.dataplane.mcast_groups == {spec.mcast_grp(6): [(0, spec.rid(6, 0)),
                                                                 (0, spec.rid(6, 1))]}
        with pytest.raises(ConfigError, match=r"jobs.yaml: jobs\[0\]: job 7: field 'slot_base'"):
            program_udp_jobs(sw, [JobConfig(job=7, workers=job.workers, nslots=9,
                                            block_size=8, nlanes=2)], "jobs.yaml")
    finally:
        sw.stop()
