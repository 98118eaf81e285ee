"""The L2-mode software switch's control plane and CLI (the packet behaviour is in bmv2_tests/).

Run just this file: python -m pytest tests/test_l2_dataplane.py
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from spina import spec
from softswitch.l2 import Dataplane, configure, ipv4_checksum
from spina.config import ConfigError

CFG = {"endpoints": ["10.0.0.100"],
       "l2": [{"mac": "02:00:00:00:01:00", "port": 1}],
       "routes": [{"prefix": "10.1.0.0/16", "port": 3, "src_mac": "02:00:00:00:00:fe",
                   "dst_mac": "02:00:00:00:00:fd"}],
       "qdepth_threshold": 9,
       "jobs": [{"job": 3, "nslots": 4, "block_size": 32, "nlanes": 4, "mcast_grp": 5,
                 "workers": [{"host": "10.0.0.1", "port": 50000, "mac": "02:00:00:00:01:00",
                              "switch_port": 1},
                             {"host": "10.0.0.2", "port": 50001, "mac": "02:00:00:00:01:01",
                              "switch_port": 2}]}]}


def test_configure_fills_every_table():
    """A switch config becomes endpoint, l2, route, congestion, admission, group and rewrites."""
    dp = Dataplane()
    configure(dp, CFG)
    assert dp.ina_endpoint == {bytes([10, 0, 0, 100])}
    assert dp.l2 == {bytes.fromhex("020000000100"): 1}
    assert len(dp.ipv4_routes) == 1
    assert dp.pipeline.qdepth_threshold == 9
    assert dp.mcast_groups[5] == [(1, 3 * 32 + 1), (2, 3 * 32 + 2)]
    adm = dp.pipeline.admission[(2, ("10.0.0.2", 50001), 3, 1)]
    assert (adm.nworkers, adm.mcast_grp, adm.nlanes) == (2, 5, 4)


def test_configure_errors_name_the_field():
    """Unknown fields and workers without a switch port are reported by name."""
    with pytest.raises(ConfigError, match="unknown field 'bogus'"):
        configure(Dataplane(), {"bogus": 1})
    bad = {"jobs": [dict(CFG["jobs"][0], workers=[{"host": "10.0.0.1", "port": 1, "mac": "x"}])]}
    with pytest.raises(ConfigError, match="switch_port"):
        configure(Dataplane(), bad)


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
    """`python -m softswitch <mode> --help` works and describes the mode."""
    out = subprocess.run([sys.executable, "-m", "softswitch", mode, "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert f"python -m softswitch {mode}" in out


def test_job_larger_than_mtu_refused():
    """L2 mode refuses a job whose full packets do not fit the links' MTU, naming nlanes."""
    cfg = dict(CFG, jobs=[dict(CFG["jobs"][0], nlanes=16, block_size=256)])
    with pytest.raises(ConfigError, match="'nlanes'.*MTU of 1500"):
        configure(Dataplane(), cfg)
    configure(Dataplane(), dict(cfg, mtu=65000))
