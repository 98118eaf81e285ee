"""The software switch's declared pipeline (softswitch/spec.py) equals p4c's P4Info.

Run just this file: python -m pytest tests/test_p4info.py
Needs `make p4` output (p4src/build/spina_v1model.p4info.txtpb, written where p4c exists);
skips otherwise. With p4c on PATH it also checks that the build output is current.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from softswitch import spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
P4INFO = ROOT / "p4src" / "build" / "spina_v1model.p4info.txtpb"
MATCH = {1: "exact", 2: "lpm", 3: "ternary"}  # p4info MatchField.MatchType


@pytest.fixture(scope="module")
def p4info():
    if not P4INFO.exists():
        pytest.skip(f"{P4INFO.relative_to(ROOT)} absent: run `make p4` where p4c-bm2-ss exists")
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    return text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())


def test_p4info_is_current(tmp_path):
    """The committed P4Info is what p4c makes of today's p4src/ (where p4c exists)."""
    if shutil.which("p4c-bm2-ss") is None or not P4INFO.exists():
        pytest.skip("p4c-bm2-ss not on PATH or no committed P4Info")
    out = tmp_path / "p4info.txtpb"
    subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "-o", str(tmp_path / "x.json"),
                    "--p4runtime-files", str(out), str(ROOT / "p4src/v1model/spina_v1model.p4")],
                   check=True)
    assert out.read_text() == P4INFO.read_text()


def test_tables_equal(p4info):
    """Tables: names, keys (name, match kind, width), actions and sizes."""
    actions = {a.preamble.id: a.preamble.name for a in p4info.actions}
    got = {}
    for t in p4info.tables:
        keys = tuple(spec.Key(m.name, MATCH[m.match_type], m.bitwidth) for m in t.match_fields)
        got[t.preamble.name] = (keys, {actions[r.id] for r in t.action_refs}, t.size)
    want = {t.name: (t.keys, set(t.actions), t.size) for t in spec.TABLES.values()}
    assert got == want


def test_actions_equal(p4info):
    """Actions: names and parameters with widths."""
    got = {a.preamble.name: tuple((p.name, p.bitwidth) for p in a.params) for a in p4info.actions}
    assert got == {a.name: a.params for a in spec.ACTIONS.values()}


def test_counters_equal(p4info):
    """Counters: names and sizes."""
    assert {c.preamble.name: c.size for c in p4info.counters} == spec.COUNTERS


def test_registers_equal(p4info):
    """Registers: the expanded names and cell widths."""
    got = {r.preamble.name: r.type_spec.bitstring.bit.bitwidth for r in p4info.registers}
    widths = {r.name: r.width for r in spec.REGISTERS}
    assert got == {n: widths[spec.split_p4_register(n)[0]] for n in spec.p4_register_names()}
