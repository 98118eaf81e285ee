"""The P4 source (p4src/) and the Python side agree on names, widths and sizes.

Run just this file: python -m pytest tests/test_p4_agreement.py

The P4 is read as text after the C preprocessor (p4c runs the same cpp), so generated
per-lane and per-element declarations are seen as p4c sees them.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from spina import spec
from spina import wire

ROOT = pathlib.Path(__file__).resolve().parents[1]
P4SRC = ROOT / "p4src"
TOP = P4SRC / "v1model" / "spina_v1model.p4"
TYPEDEFS = {"mac_addr_t": 48, "ipv4_addr_t": 32, "port_t": 9, "mcast_grp_t": 16, "qdepth_t": 19}
STD_WIDTHS = {"ingress_port": 9, "egress_rid": 16}


def _width(t: str) -> int:
    m = re.fullmatch(r"bit<(\d+)>", t.strip())
    return int(m.group(1)) if m else TYPEDEFS[t.strip()]


@pytest.fixture(scope="module")
def p4(tmp_path_factory) -> str:
    """The v1model program after cpp (core.p4/v1model.p4 stubbed: we only read our own code)."""
    if shutil.which("cpp") is None:
        pytest.skip("cpp (the C preprocessor p4c also uses) is not installed")
    stub = tmp_path_factory.mktemp("p4stub")
    (stub / "core.p4").write_text("")
    (stub / "v1model.p4").write_text("")
    out = subprocess.run(["cpp", "-P", "-undef", "-nostdinc", f"-I{stub}", str(TOP)],
                         capture_output=True, text=True, check=True).stdout
    return re.sub(r"\s+", " ", out)


def _named(p4: str, kind: str) -> set[str]:
    """Global @name(".x") declarations of a kind: register, counter, table, action."""
    if kind == "register":
        pat = r'@name\("\.(\w+)"\) register<'
    elif kind == "counter":
        pat = r'@name\("\.(\w+)"\) counter\('
    else:
        pat = r'@name\("\.(\w+)"\) ' + kind + r" \w+"
    return set(re.findall(pat, p4))


def _block(p4: str, head: str) -> str:
    """The text between the braces that follow `head`."""
    i = p4.index(head)
    i = p4.index("{", i)
    depth = 0
    for j in range(i, len(p4)):
        depth += {"{": 1, "}": -1}.get(p4[j], 0)
        if depth == 0:
            return p4[i + 1:j]
    raise AssertionError(f"unbalanced braces after {head}")


def _header_fields(p4: str, name: str) -> list[tuple[str, int]]:
    body = _block(p4, f"header {name} ")
    return [(n, _width(t)) for t, n in re.findall(r"(bit<\d+>|\w+_t) (\w+);", body)]


def test_ina_header_equals_wire_fields(p4):
    """header ina_h lists wire.HEADER_FIELDS: same names, order and bit widths."""
    assert _header_fields(p4, "ina_h") == [(n, w) for n, _, w in wire.HEADER_FIELDS]


def test_ina_header_text_without_cpp():
    """header.p4 itself (before cpp) declares ina_h with wire's fields, for readers of the file."""
    text = re.sub(r"//.*", "", (P4SRC / "shared" / "header.p4").read_text())
    body = _block(re.sub(r"\s+", " ", text), "header ina_h ")
    got = [(n, int(w)) for w, n in re.findall(r"bit<(\d+)> (\w+);", body)]
    assert got == [(n, w) for n, _, w in wire.HEADER_FIELDS]


def test_block_header_has_block_size_elements(p4):
    """block_h holds BLOCK_SIZE int32 fields e0.. in order."""
    fields = _header_fields(p4, "block_h")
    assert fields == [(f"e{i}", 32) for i in range(spec.P4_SIZES["BLOCK_SIZE"])]


def test_registers_agree(p4):
    """Every register the software switch has is declared in P4 (expanded per lane/element)."""
    assert _named(p4, "register") == set(spec.p4_register_names())


def test_register_widths_agree(p4):
    """Register cell widths match spina/spec.py."""
    widths = dict(re.findall(r'@name\("\.(\w+)"\) register<bit<(\d+)>>', p4))
    for name in spec.p4_register_names():
        base = spec.split_p4_register(name)[0]
        assert int(widths[name]) == {r.name: r for r in spec.REGISTERS}[base].width, name


def test_counters_agree(p4):
    """job_* and port_* counters: the same set on both sides, sized by job and by port."""
    assert _named(p4, "counter") == set(spec.COUNTERS)
    sizes = dict(re.findall(r'@name\("\.(\w+)"\) counter\((\w+),', p4))
    for name, size in spec.COUNTERS.items():
        assert sizes[name] in ("MAX_JOBS", "MAX_PORTS", str(size))


def test_tables_agree(p4):
    """The same tables, keys (@name, match kind, width), actions and default actions."""
    assert _named(p4, "table") == set(spec.TABLES)
    for t in spec.TABLES.values():
        body = _block(p4, f'@name(".{t.name}") table ')
        keys = []
        if "key =" in body:
            for expr, match, name in re.findall(r"([\w.]+): (\w+) @name\(\"(\w+)\"\);",
                                                _block(body, "key =")):
                obj, field = expr.rsplit(".", 1)
                width = (STD_WIDTHS[field] if obj == "std"
                         else dict(_header_fields(p4, _header_type(p4, obj.split(".")[1])))[field])
                keys.append(spec.Key(name, match, width))
        assert tuple(keys) == t.keys, t.name
        acts = re.findall(r"(\w+);", _block(body, "actions ="))
        assert set(acts) == set(t.actions), t.name
        assert re.search(r"default_action = (\w+)\(", body).group(1) == t.default, t.name


def _header_type(p4: str, member: str) -> str:
    body = _block(p4, "struct headers_t ")
    return re.search(r"(\w+)(?:\[\w+\])? " + member + ";", body).group(1)


def test_actions_agree(p4):
    """Every table action is declared in P4 with the same parameters and widths."""
    declared = _named(p4, "action")
    assert declared == set(spec.ACTIONS) - {"NoAction"}
    for a in spec.ACTIONS.values():
        if a.name == "NoAction":
            continue
        m = re.search(r'@name\("\.' + a.name + r'"\) action \w+\(([^)]*)\)', p4)
        params = [p.strip().rsplit(" ", 1) for p in m.group(1).split(",") if p.strip()]
        assert [(n, _width(t)) for t, n in params] == list(a.params), a.name


def test_sizes_agree():
    """size.p4's defines equal spina/spec.py P4_SIZES."""
    text = (P4SRC / "shared" / "size.p4").read_text()
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
    """define.p4's protocol constants equal spina/wire.py and spina/spec.py."""
    text = (P4SRC / "shared" / "define.p4").read_text()
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
    for bit, name in wire.FLAG_NAMES.items():
        assert consts[f"FLAG_{name.upper()}"] == bit


def test_braces_balance(p4):
    """The preprocessed program has balanced braces and parentheses (a cheap syntax check)."""
    assert p4.count("{") == p4.count("}")
    assert p4.count("(") == p4.count(")")


def test_software_switch_uses_spec_names():
    """The software switch's registers, counters and writable tables are exactly spec's."""
    from softswitch.l2 import Dataplane
    dp = Dataplane(pool_slots=4, slot_capacity=128)
    assert set(dp.registers) == set(spec.REGISTER_NAMES)
    assert set(dp.counters) == set(spec.COUNTERS)
    writable = {"ina_endpoint", "admission", "l2", "ipv4_routes", "worker_rewrite"}
    assert writable | {"congestion"} == set(spec.TABLES)  # congestion: default action only
    for name in spec.p4_register_names():
        dp.register(name, 0)  # every P4 register name resolves
