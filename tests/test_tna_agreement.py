"""The Tofino 1 program (tofino/) and the Python side (spina/spec.py) agree.

Run just this file: python -m pytest tests/test_tna_agreement.py

Without bf-p4c: size.p4's defines against spec.TNA_SIZES, and the names the preprocessed
program declares (tables and their keys, registers with cell widths and sizes, counters with
sizes, the rank -> bit const table) against spec's TNA lists. With the committed build
(tofino/build/, `make tofino`): bf-p4c's P4Info against spec.tna_p4info(), as
tests/test_p4info.py does for p4src; where bf-p4c is on PATH, also that the committed P4Info
is what it makes of today's tofino/ (skipped, saying so, elsewhere).
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from spina import spec, wire
from tests.test_p4info import shape

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOFINO = ROOT / "tofino"
P4INFO = TOFINO / "build" / "spina_tna.p4info.txtpb"
S = spec.TNA_SIZES


def _preprocessed(tmp_path_factory, *defines: str, top: str = "spina_tna.p4") -> str:
    """A top file of tofino/ (the default profile's unless `top`) after cpp (core.p4 and tna.p4
    stubbed out: only our text counts)."""
    if shutil.which("cpp") is None:
        pytest.skip("cpp not on PATH: the TNA program's macros cannot be expanded here")
    stubs = tmp_path_factory.mktemp("p4include")
    for name in ("core.p4", "tna.p4"):
        (stubs / name).write_text("")
    out = subprocess.run(["cpp", "-P", "-undef", "-nostdinc", f"-I{stubs}", *defines,
                          str(TOFINO / top)],
                         check=True, capture_output=True, text=True).stdout
    return re.sub(r"\s+", " ", out)


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> str:
    """The program as compiled by default."""
    return _preprocessed(tmp_path_factory)


def test_sizes_agree():
    """tofino/size.p4's defines equal spec.TNA_SIZES (text: the names are gone after bf-p4c)."""
    text = (TOFINO / "size.p4").read_text()
    defines = dict(re.findall(r"#define (\w+) (\d+)\s", text))
    for name, value in S.items():
        assert int(defines[name]) == value, name
    assert int(defines["SLOT_COPIES"]) == 2 * S["POOL_SLOTS"]
    # each lane-width profile (-DSPINA_LANE_BITS): its width flag and block bytes as wire has them
    profiles = re.findall(r"SPINA_LANE_BITS == (\d+)\n#define LANE_FLAG (\w+)\n"
                          r"#define BLOCK_BYTES (\d+)\n", text)
    assert {int(b): (int(f, 0), int(n)) for b, f, n in profiles} == {
        b: (wire.LANE_FLAGS[b], wire.row_bytes(S["BLOCK_SIZE"], wire.LANE_FLAGS[b]))
        for b in wire.LANE_BITS}
    assert S["RANK_CELLS"] == 2 * S["POOL_SLOTS"] * S["MAX_WORKERS"]


def test_registers_agree(program):
    """Every Register of the program: spec's TNA name, cell width and number of cells."""
    widths = {"bit<32>": 32, "bit<16>": 16, "bit<8>": 8, "loss_credit_t": 32,
              spec.TNA_PAIR_TYPE: spec.TNA_PAIR_WIDTH}
    got = {name: (widths[cell], int(cells)) for name, cell, cells in re.findall(
        r'@name\("\.(\w+)"\) Register<([\w<>]+), [\w<>]+>\((\d+)', program)}
    assert got == {name: (width, cells) for name, width, cells in spec.tna_registers()}


def test_counters_agree(program):
    """Every Counter: spec's name and number of cells (MAX_JOBS or MAX_PORTS)."""
    got = {name: int(cells) for name, cells in re.findall(
        r'@name\("\.(\w+)"\) Counter<bit<32>, [\w<>]+>\((\d+), CounterType_t\.PACKETS\)', program)}
    assert got == spec.TNA_COUNTERS


def test_tables_and_keys_agree(program):
    """The control-plane tables (global @name) are spec's TNA_TABLES, with spec's key names
    and match kinds in order; the internal const tables are @hidden."""
    tables = dict(re.findall(r'@name\("\.(\w+)"\) table \w+ \{ key = \{ (.*?) \}', program))
    assert set(tables) == set(spec.TNA_TABLES)
    for name, keys in tables.items():
        got = re.findall(r': (\w+) @name\("(\w+)"\);', keys)
        assert got == [(k.match, k.name) for k in spec.TABLES[name].keys], name
    hidden = re.findall(r"@hidden table (\w+)", program)
    assert hidden and all(t not in spec.TABLES for t in hidden)
    assert len(re.findall(r"(?<!@hidden )table \w+ \{", program)) == len(spec.TNA_TABLES)


def test_rank_to_bit_entries(program):
    """rank_to_bit's const entries map rank r to 1 << r for every rank (no variable shift)."""
    entries = re.findall(r"(\d+): set_rank_bit\(32w1 << (\d+)\);", program)
    assert [(int(r), int(b)) for r, b in entries] == [(r, r) for r in range(S["MAX_WORKERS"])]


def _bf_p4c_shape(text: str) -> dict:
    """bf-p4c's TNA P4Info by names, in test_p4info.shape's form. Its counters and registers
    are `externs` whose info is a barefoot.* message (not in p4runtime's descriptor pool):
    those blocks are read as text; names carry the pipe's prefix ("pipe.admission")."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    blocks = re.findall(r"^externs \{\n.*?^\}\n", text, re.S | re.M)
    rest = text
    for b in blocks:
        rest = rest.replace(b, "")
    info = text_format.Parse(rest, p4info_pb2.P4Info())
    for obj in [*info.tables, *info.actions]:
        obj.preamble.name = obj.preamble.name.removeprefix("pipe.")
    out = shape(info)
    for block in blocks:
        kind = re.search(r'extern_type_name: "(\w+)"', block).group(1)
        if kind not in ("Counter", "Register"):
            continue  # PortMetadata, Snapshot: no control-plane state of ours
        for inst in block.split("  instances {")[1:]:
            name = re.search(r'name: "(?:pipe\.)?([\w.]+)"', inst).group(1)
            size = int(re.search(r"\n        size: (\d+)", inst).group(1))
            if kind == "Counter":
                out["counters"][name] = size
            elif kind == "Register":  # a pair register's cell is a struct (type_info)
                struct = re.search(r'struct \{\s*name: "(\w+)"', inst)
                width = (sum(m.type_spec.bitstring.bit.bitwidth
                             for m in info.type_info.structs[struct.group(1)].members)
                         if struct else int(re.search(r"bitwidth: (\d+)", inst).group(1)))
                out["registers"][name] = (width, size)
    return out


def test_bf_p4c_p4info_equals_spec():
    """bf-p4c's P4Info (tofino/build/, committed by `make tofino`) and spec.tna_p4info() are
    the same by name: tables, keys, actions and scopes, sizes, counters, registers."""
    if not P4INFO.exists():
        pytest.skip(f"{P4INFO.relative_to(ROOT)} is not committed: the TNA program has not "
                    "been compiled by bf-p4c")
    assert _bf_p4c_shape(P4INFO.read_text()) == shape(spec.tna_p4info())


def test_tna_p4info_is_current(tmp_path):
    """The committed P4Info is what bf-p4c makes of today's tofino/ (where bf-p4c exists)."""
    if shutil.which("bf-p4c") is None:
        pytest.skip("bf-p4c not on PATH: the committed TNA P4Info cannot be rebuilt here")
    out = tmp_path / "p4info.txtpb"
    subprocess.run(["bf-p4c", "--target", "tofino", "--arch", "tna", "-o", str(tmp_path / "out"),
                    "--p4runtime-files", str(out), str(TOFINO / "spina_tna.p4")],
                   check=True, capture_output=True)
    # bf-p4c 1.2.5.16 lists some repeated entries (its pipe's extern instances) in an order
    # that changes from run to run: compare the contents, not the order.
    assert _canonical(out.read_text()) == _canonical(P4INFO.read_text())


def _canonical(text: str):
    """A P4Info text with every repeated message sorted: the p4runtime part parsed and sorted
    recursively; the `externs` blocks (barefoot.* messages, not in the descriptor pool) as
    their text, instance blocks sorted."""
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    def sort(msg):
        for field, value in msg.ListFields():
            if field.type != field.TYPE_MESSAGE:
                continue
            if (field.label == field.LABEL_REPEATED
                    and not field.message_type.GetOptions().map_entry):
                for m in value:
                    sort(m)
                items = [type(m)() for m in value]
                for c, m in zip(items, value):
                    c.CopyFrom(m)
                items.sort(key=lambda m: m.SerializeToString(deterministic=True))
                del value[:]
                value.extend(items)
            elif field.label != field.LABEL_REPEATED:
                sort(value)
    blocks = re.findall(r"^externs \{\n.*?^\}\n", text, re.S | re.M)
    rest = text
    for blk in blocks:
        rest = rest.replace(blk, "")
    info = text_format.Parse(rest, p4info_pb2.P4Info())
    sort(info)
    bodies = [blk.rstrip("\n")[:-1].split("  instances {") for blk in blocks]  # without "}"
    externs = sorted((b[0], tuple(sorted(x.rstrip() for x in b[1:]))) for b in bodies)
    return info.SerializeToString(deterministic=True), externs


HOLD_COMPARISONS = ("RegisterAction hold.apply needs 3 comparisons but the device only has 2 "
                    "comparison units")


HOLD_VARIANTS = {
    ("tofino", 1): ["mask operand must be a constant", HOLD_COMPARISONS],
    ("tofino", 2): [HOLD_COMPARISONS],
    ("tofino", 3): [HOLD_COMPARISONS.replace("3 comparisons", "4 comparisons")],
    ("tofino", 4): [HOLD_COMPARISONS.replace("3 comparisons", "4 comparisons")],
    ("tofino2", 1): ["mask operand must be a constant"],
    ("tofino2", 2): ["Could not place table tbl_hold{line}: The table tbl_hold{line} could not "
                     "fit within the input crossbar by itself: Hold.head requires more than 2 "
                     "PHV inputs"],
    ("tofino2", 3): ["The input ingress::m.rank_bit to stateful alu Hold.head is not allocated "
                     "in a valid region on the input xbar to be a source of an ALU operation"],
    ("tofino2", 4): [],  # the hold masks: include/hold.p4's RegisterAction
}


@pytest.mark.parametrize("target,variant", sorted(HOLD_VARIANTS))
def test_the_hold_on_one_stateful_alu(tmp_path, target, variant):
    """Issue 28 item 2 and 46 item 3, where bf-p4c is on PATH: the hold of a newer round as
    one RegisterAction (tofino/experiments/hold.p4) is refused on Tofino 1 in every layout,
    and on Tofino 2 in all but the hold masks' (variant 4, include/hold.p4's), with exactly
    the messages tofino/README.md quotes ("The hold and the roles on Tofino 1", "Tofino 2"),
    and no others."""
    out, got = _compile_experiment(tmp_path, "hold.p4", variant, "the hold's RegisterAction",
                                   target)
    line = next(iter(re.findall(r"tbl_hold(\d+)", out.stderr)), "")
    errors = [e.format(line=line) for e in HOLD_VARIANTS[target, variant]]
    assert [g.split(". To make")[0] for g in got] == errors, out.stderr
    assert (out.returncode == 0) == (not errors), out.stderr
    assert f"{len(errors)} error" in out.stderr


def _compile_experiment(tmp_path, name: str, variant: int, what: str, target: str = "tofino"):
    """bf-p4c on tofino/experiments/NAME with -DVARIANT=variant for `target` (tofino: TNA,
    tofino2: T2NA): (the completed process, each error's message without its location); a
    skip naming `what` without bf-p4c."""
    if shutil.which("bf-p4c") is None:
        pytest.skip(f"bf-p4c not on PATH: {what} cannot be compiled here")
    arch = {"tofino": "tna", "tofino2": "t2na"}[target]
    out = subprocess.run(["bf-p4c", "--target", target, "--arch", arch,
                          f"-DVARIANT={variant}", "-o", str(tmp_path),
                          str(TOFINO / "experiments" / name)],
                         capture_output=True, text=True)
    got = [re.split(r"error: (?:\S+\(\d+\): |: )?", line, maxsplit=1)[1]
           for line in out.stderr.splitlines() if "error: " in line
           and not re.search(r"\d+ errors?, \d+ warnings? generated", line)]
    return out, got


ROLES_REFUSALS = {
    1: [],  # slot_count's fourth RegisterAction (a leaf's store) fits
    2: ["Roles.pair: too many RegisterActions attached to the Register"],
    3: ["condition expression too complex"],
    4: [],  # a spine's carried flags ORed in slot_flags' stateful ALU fit
    5: ["Could not place table tbl_roles82: The table tbl_roles82 could not fit within the "
        "input crossbar by itself: Roles.slot_count requires more than 2 PHV inputs"],
}


@pytest.mark.parametrize("variant", sorted(ROLES_REFUSALS))
def test_role_pieces_on_one_stateful_alu(tmp_path, variant):
    """Issue 28 item 2, where bf-p4c is on PATH: the fabric roles' pieces in
    tofino/experiments/roles.p4 compile, or are refused with exactly the message
    tofino/README.md quotes ("The hold and the roles on Tofino 1"), and no other."""
    out, got = _compile_experiment(tmp_path, "roles.p4", variant, "the roles' pieces")
    errors = ROLES_REFUSALS[variant]
    assert got == errors, out.stderr
    assert (out.returncode == 0) == (not errors), out.stderr
    assert f"{len(errors)} error" in out.stderr


def _tables(text: str) -> dict:
    return {name: re.findall(r': (\w+) @name\("(\w+)"\);', keys) for name, keys in
            re.findall(r'@name\("\.(\w+)"\) table \w+ \{ key = \{ (.*?) \}', text)}


def test_roles_profile_adds_the_role_tables(program, tmp_path_factory):
    """tofino/spina_tna_roles.p4 (the roles' measurement profile) adds exactly p4src's
    job_level and leaf_upstream, with p4src's key names, to the program's control-plane
    tables; the default program declares neither (the controller's has_roles reads that)."""
    roles = _tables(_preprocessed(tmp_path_factory, top="spina_tna_roles.p4"))
    flat = _tables(program)
    assert set(roles) - set(flat) == {"job_level", "leaf_upstream"}
    assert {name: roles[name] for name in flat} == flat
    for name in ("job_level", "leaf_upstream"):
        assert roles[name] == [(k.match, k.name) for k in spec.TABLES[name].keys], name


def _macros(path: pathlib.Path) -> set[str]:
    return set(re.findall(r"^#define (\w+)", path.read_text(), re.M))


def test_profiles_define_the_same_hooks():
    """include/profile_flat.p4 and profile_roles.p4 define the same hooks (the roles' helper
    macros aside), and every SPINA_ROLE_* name a shared file of tofino/ expands is one of
    them; no shared file selects a profile by #ifdef."""
    inc = TOFINO / "include"
    flat, roles = _macros(inc / "profile_flat.p4"), _macros(inc / "profile_roles.p4")
    guards = {"SPINA_TNA_PROFILE_FLAT_P4", "SPINA_TNA_PROFILE_ROLES_P4"}
    helpers = {"SPINA_ALL_RANKS_ENTRY", "SPINA_CARRIED"}  # used by roles' hooks only
    assert flat - guards == roles - guards - helpers
    shared = [p for p in [*inc.glob("*.p4"), *TOFINO.glob("*.p4")]
              if not p.name.startswith("profile_")]
    used = {m for p in shared for m in re.findall(r"\bSPINA_ROLE_\w+", p.read_text())}
    assert used and used <= flat
    assert not [p.name for p in shared if "#ifdef SPINA_TNA_ROLES" in p.read_text()]


def test_hold_files_define_the_same_hooks():
    """include/hold.p4 and hold_none.p4 define the same hooks (hold.p4's entry macro aside),
    every SPINA_HOLD_* name a shared file expands is one of them, and each top file includes
    exactly one of the two: the hold only in the Tofino 2 profile."""
    inc = TOFINO / "include"
    hold, none = _macros(inc / "hold.p4"), _macros(inc / "hold_none.p4")
    guards = {"SPINA_TNA_HOLD_P4", "SPINA_TNA_HOLD_NONE_P4"}
    assert hold - guards - {"SPINA_HOLD_LAST_ENTRY"} == none - guards
    shared = [p for p in inc.glob("*.p4") if not p.name.startswith(("profile_", "hold"))]
    used = {m for p in shared for m in re.findall(r"\bSPINA_HOLD_\w+", p.read_text())}
    assert used == none - guards
    tops = {p.name: re.findall(r'#include "include/(hold\w*)\.p4"', p.read_text())
            for p in TOFINO.glob("spina_*.p4")}
    assert tops == {"spina_tna.p4": ["hold_none"], "spina_tna_roles.p4": ["hold_none"],
                    "spina_t2na_roles.p4": ["hold"]}


def test_the_t2na_roles_profile_declares_the_roles_and_the_hold():
    """bf-p4c's standard-externs P4Info of tofino/spina_t2na_roles.p4 (Tofino 2, committed in
    tofino/build/): the controller takes it as a leaf or spine (has_roles) and for bounded
    loss (has_hold: head_round, one cell per slot of include/hold.p4's head_t, and job_held);
    its as_leaf takes the roles' profile's parameters, which the controller derives from the
    ones spec (p4src) gives the rows (spina/rows.py DERIVED_PARAMS)."""
    from controller import tofino
    from controller.pipeline import read_p4info
    from spina import rows
    info = read_p4info(TOFINO / "build/spina_t2na_roles.std.p4info.txtpb", "tofino", "test")
    assert tofino.has_roles(info) and tofino.has_hold(info)
    (head,) = [r for r in info.registers if r.preamble.name == "head_round"]
    assert (head.size, head.type_spec.struct.name) == (spec.TNA_SIZES["POOL_SLOTS"], "head_t")
    assert [m.name for m in info.type_info.structs["head_t"].members] == ["round", "pending"]
    assert "job_held" in {c.preamble.name for c in info.counters}
    (as_leaf,) = [a for a in info.actions if a.preamble.name.rsplit(".", 1)[-1] == "as_leaf"]
    names = [p.name for p in as_leaf.params]
    assert [(p.name, p.bitwidth) for p in as_leaf.params] == [
        ("rack", 8), ("rack_bit", 32), ("all_local", 32), ("epoch", 16)]
    assert spec.ACTIONS["as_leaf"].params == (
        ("rack", 8), ("nlocal", 8), ("epoch", 16), ("mcast_grp", 16))
    assert rows.program_params("as_leaf", {"rack": 2, "nlocal": 5, "epoch": 9, "mcast_grp": 7},
                               names) == {"rack": 2, "rack_bit": 4, "all_local": 31, "epoch": 9}
