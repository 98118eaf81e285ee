"""The declared pipeline (spina/spec.py, what the software switch serves and the controller
names) equals p4c's P4Info.

Run just this file: python -m pytest tests/test_p4info.py
The comparison reads the committed P4Info (p4src/build/spina_v1model.p4info.txtpb, written by
`make p4`) and needs no p4c: it runs everywhere. Only `test_p4info_is_current`, which compiles
today's p4src/ and compares the result with the committed file, needs p4c-bm2-ss on PATH and
skips without it. Names, widths, match kinds, @defaultonly scopes and sizes are compared; IDs
are not (the controller looks names up).
"""
from __future__ import annotations

import pathlib
import shutil

import pytest

from spina import spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
P4INFO = ROOT / "p4src" / "build" / "spina_v1model.p4info.txtpb"


def shape(info) -> dict:
    """A P4Info by names: tables, actions, counters, registers with their widths and sizes."""
    from p4.config.v1 import p4info_pb2
    match = {v: k.lower() for k, v in p4info_pb2.MatchField.MatchType.items()}
    scope = {v: k.lower() for k, v in p4info_pb2.ActionRef.Scope.items()}
    actions = {a.preamble.id: a.preamble.name for a in info.actions}
    return {
        "tables": {t.preamble.name: (tuple((m.name, match[m.match_type], m.bitwidth)
                                           for m in t.match_fields),
                                     frozenset((actions[r.id], scope[r.scope])
                                               for r in t.action_refs), t.size)
                   for t in info.tables},
        "actions": {a.preamble.name: tuple((p.name, p.bitwidth) for p in a.params)
                    for a in info.actions},
        "counters": {c.preamble.name: c.size for c in info.counters},
        "registers": {r.preamble.name: (spec.p4info_register_width(info, r), r.size)
                      for r in info.registers},
    }


@pytest.fixture(scope="module")
def p4c_info():
    """The committed P4Info (its absence is a failure: it is part of the repository)."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    return text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())


def test_p4c_p4info_equals_spec(p4c_info):
    """p4c's P4Info and the declared pipeline are the same by name: every table (keys, match
    kinds, widths, actions and their scopes, size), action parameter, counter and register."""
    assert shape(p4c_info) == shape(spec.p4info())
    assert {n for n in shape(p4c_info)["registers"]} == \
        set(spec.p4_register_names()) | {r.name for r in spec.JOB_REGISTERS} | \
        {r.name for r in spec.SPRAY_REGISTERS}


def test_p4info_is_current(tmp_path):
    """The committed P4Info is what p4c makes of today's p4src/ (where p4c exists)."""
    if shutil.which("p4c-bm2-ss") is None:
        pytest.skip("p4c-bm2-ss not on PATH: the committed P4Info cannot be rebuilt here")
    from bmv2_tests import bmv2  # the one compile of p4src a test run shares
    _, out = bmv2.compile_p4(tmp_path)
    assert out.read_text() == P4INFO.read_text()


def test_only_the_tna_pair_registers_are_structs():
    """The TNA program's pair registers are P4 structs of two 32-bit halves; every register of
    the v1model pipeline, 64-bit slot_present included, stays a bitstring (the software
    switch's P4Runtime server refuses a struct write to it: the demo's deploy failed so)."""
    kinds = {r.preamble.name: r.type_spec.WhichOneof("type_spec") for r in spec.p4info().registers}
    assert set(kinds.values()) == {"bitstring"} and "slot_present" in kinds
    tna = {r.preamble.name: r.type_spec.WhichOneof("type_spec")
           for r in spec.tna_p4info().registers}
    assert {n for n, k in tna.items() if k == "struct"} == set(spec.tna_pair_registers())
