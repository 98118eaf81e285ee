"""The P4 program (p4src/) and the Python side (spina/wire.py, spina/spec.py) agree.

Run just this file: python -m pytest tests/test_p4_agreement.py

Facts p4c's output carries are checked against the committed build in p4src/build/ (`make p4`),
never against the P4 text:
- the P4Info (tables, keys with match kinds and widths, actions and parameters, counters,
  registers, sizes): tests/test_p4info.py compares it with spec.p4info();
- the BMv2 JSON (header layouts, each table's actions and default action): here.
Where p4c is installed, tests/test_p4info.py also checks that the committed build is what p4c
makes of today's p4src/. Only what neither output carries by name is read as text: size.p4's
defines (the P4 sizes, folded into array sizes) and define.p4's protocol constants (folded into
the parser's and controls' code).
"""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from spina import spec, wire

ROOT = pathlib.Path(__file__).resolve().parents[1]
P4SRC = ROOT / "p4src"
BMV2_JSON = P4SRC / "build" / "spina_v1model.json"


@pytest.fixture(scope="module")
def bmv2_json() -> dict:
    """The committed BMv2 JSON p4c wrote for p4src/v1model/spina_v1model.p4."""
    return json.loads(BMV2_JSON.read_text())


def _header_fields(program: dict, name: str) -> list[tuple[str, int]]:
    types = {h["name"]: h for h in program["header_types"]}
    return [(f[0], f[1]) for f in types[name]["fields"]]


def test_ina_header_equals_wire_fields(bmv2_json):
    """header ina_h has wire.HEADER_FIELDS: same names, order and bit widths."""
    assert _header_fields(bmv2_json, "ina_h") == [(n, w) for n, _, w in wire.HEADER_FIELDS]


def test_block_header_has_block_size_elements(bmv2_json):
    """block_h holds BLOCK_SIZE 32-bit fields e0.. in order."""
    assert _header_fields(bmv2_json, "block_h") == \
        [(f"e{i}", 32) for i in range(spec.P4_SIZES["BLOCK_SIZE"])]


def test_tables_actions_and_defaults_agree(bmv2_json):
    """Every table of spec.TABLES has the same actions and default action in the program."""
    actions = {a["id"]: a["name"] for a in bmv2_json["actions"]}
    tables = {t["name"]: t for p in bmv2_json["pipelines"] for t in p["tables"]}
    for t in spec.TABLES.values():
        got = tables[t.name]
        assert set(got["actions"]) == set(t.actions), t.name
        assert actions[got["default_entry"]["action_id"]] == t.default, t.name


def test_register_and_counter_arrays_agree(bmv2_json):
    """The program's register arrays (names, cell widths, two copies per slot or one cell per
    job) and counter arrays (names, sizes) are spec's."""
    widths = {r.name: r.width for r in spec.REGISTERS}
    assert {r["name"]: (r["bitwidth"], r["size"]) for r in bmv2_json["register_arrays"]} == \
        {n: (widths[spec.split_p4_register(n)[0]], spec.register_cells(n))
         for n in spec.p4_register_names()} | \
        {r.name: (r.width, spec.MAX_JOBS) for r in spec.JOB_REGISTERS} | \
        {r.name: (r.width, spec.P4_SIZES["SPRAY_GROUPS"]) for r in spec.SPRAY_REGISTERS}
    assert {c["name"]: c["size"] for c in bmv2_json["counter_arrays"]} == spec.COUNTERS


def test_sizes_agree():
    """size.p4's defines equal spina/spec.py P4_SIZES (text: the names are gone after p4c)."""
    text = (P4SRC / "v1model" / "size.p4").read_text()
    defines = dict(re.findall(r"#define (\w+) (\d+)\s", text))
    for name, value in spec.P4_SIZES.items():
        assert int(defines[name]) == value, name
    assert int(defines["SLOT_COPIES"]) == 2 * spec.P4_SIZES["POOL_SLOTS"]
    assert int(defines["BLOCK_BYTES"]) == 4 * spec.P4_SIZES["BLOCK_SIZE"]


def test_p4_packet_fits_mtu():
    """A full P4-sized packet (all lanes present) fits a 1500-byte IPv4 MTU."""
    s = spec.P4_SIZES
    assert 20 + 8 + wire.packet_len(s["NLANES"], s["BLOCK_SIZE"], s["NLANES"]) <= 1500


def test_constants_agree():
    """define.p4's protocol constants (and define_v1model.p4's QDEPTH_NEVER) equal
    spina/wire.py and spina/spec.py (text: p4c folds them into the code)."""
    text = "".join((P4SRC / f).read_text() for f in ("shared/define.p4",
                                                     "v1model/define_v1model.p4"))
    consts = {n: int(v, 0) for n, v in re.findall(r"const \w+(?:<\d+>)?\s+(\w+) = (\w+);", text)}
    assert consts["INA_UDP_PORT"] == wire.DEFAULT_UDP_PORT == spec.INA_UDP_PORT
    assert consts["ETHERTYPE_IPV4"] == spec.ETHERTYPE_IPV4
    assert consts["IP_PROTO_UDP"] == spec.IP_PROTO_UDP
    assert consts["INA_VERSION"] == wire.VERSION
    assert consts["INA_HDR_BYTES"] == wire.HEADER_LEN
    assert consts["WIRE_MAX_LANES"] == wire.MAX_LANES
    assert consts["WIRE_MAX_WORKERS"] == wire.MAX_WORKERS
    assert consts["QDEPTH_NEVER"] == spec.QDEPTH_NEVER
    for code, name in wire.MSG_NAMES.items():
        assert consts[f"MSG_{name.upper()}"] == code
    for bit, name in {**wire.FLAG_NAMES, **wire.LANE_FLAG_NAMES}.items():
        assert consts[f"FLAG_{name.upper()}"] == bit
    assert consts["FLAGS_LANE_WIDTH"] == wire.FLAGS_LANE_WIDTH
    assert consts["FLAGS_CARRIED"] == spec.FLAGS_CARRIED  # the roles' flag sets
    assert consts["FLAGS_RESULT"] == spec.FLAGS_RESULT


def test_software_switch_uses_spec_names():
    """The software switch's registers, counters and writable tables are exactly spec's."""
    from softswitch.dataplane import Dataplane
    dp = Dataplane(pool_slots=4, slot_capacity=128)
    assert set(dp.registers) == set(spec.REGISTER_NAMES)
    assert set(dp.counters) == set(spec.COUNTERS)
    writable = {"ina_endpoint", "admission", "l2", "ipv4_routes", "worker_rewrite", "congestion",
                "job_level", "leaf_upstream", "spray_ports"}
    assert writable == set(spec.TABLES)
    for name in spec.p4_register_names():
        dp.register(name, 0)  # every P4 register name resolves
