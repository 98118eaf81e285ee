"""P4Testgen's PTF tests of the TNA program as the fixtures tests/test_tna_testgen.py replays.

Usage: python3 scripts/testgen_fixtures.py PTF_FILE COMMAND_FILE > tofino/testgen/NAME.json

PTF_FILE is what `p4testgen --target tofino --arch tna --test-backend PTF` wrote (one Python
file, a class per test); COMMAND_FILE holds the generator's version line and the command that
ran it (tofino/testgen/README.md), copied into the fixture file as they are. Each test becomes
a fixture: its table entries (key field -> value, [value, mask] or [value, prefix_len]), default
overrides, the register cells P4Testgen assumed before the packet (name, index, value; a pair
register's value is [lo, hi], head_round's [round, pending]), the frame and its ingress port,
and the frame expected out (port, bytes, and a mask of the bits compared) or null when nothing
leaves. Read with `ast`: nothing of the PTF file is run. Standard library only. The same for
`--target tofino2 --arch t2na` (the Tofino 2 profile, tofino/testgen/t2na/).
"""
from __future__ import annotations

import ast
import json
import re
import sys

# A struct cell's members in the P4 struct's order, whatever order the PTF file writes them in:
# pair_t (tofino/include/pairs.p4), head_t (tofino/include/hold.p4); others as written.
STRUCT_MEMBERS = {frozenset(("lo", "hi")): ["lo", "hi"],
                  frozenset(("round", "pending")): ["round", "pending"]}


def _value(node):
    return ast.literal_eval(node)


def _key(call: ast.Call):
    """gc.KeyTuple(name, value[, mask] [, prefix_len=N] [, low=, high=]) -> (name, value)."""
    name = _value(call.args[0])
    kw = {k.arg: _value(k.value) for k in call.keywords}
    if "prefix_len" in kw:
        return name, [_value(call.args[1]), kw["prefix_len"]]
    if "low" in kw:
        return name, [kw["low"], kw["high"]]
    if len(call.args) == 3:
        return name, [_value(call.args[1]), _value(call.args[2])]
    return name, _value(call.args[1])


def _calls(func: ast.FunctionDef, method: str):
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == method):
            yield node


def _assigned(func: ast.FunctionDef) -> dict:
    """Each name's first value (`exp_pkt = Mask(exp_pkt)` comes after the bytes)."""
    out: dict = {}
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
            out.setdefault(n.targets[0].id, n.value)
    return out


def _short(name: str) -> str:
    """A control-plane name without its pipe and control prefix (the P4 programs' @name)."""
    return name.rsplit(".", 1)[-1]


def fixture(cls: ast.ClassDef, lines: list[str]) -> dict:
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    setup = methods["setupCtrlPlane"]
    entries = []
    for call in _calls(setup, "insertTableEntry"):
        keys = dict(_key(k) for k in call.args[1].elts)
        params = {_value(d.args[0]): _value(d.args[1]) for d in call.args[3].elts}
        entries.append({"table": _short(_value(call.args[0])), "keys": keys,
                        "action": _short(_value(call.args[2])), "params": params})
    defaults = [{"table": _short(_value(c.args[0])), "action": _short(_value(c.args[1])),
                 "params": {_value(d.args[0]): _value(d.args[1]) for d in c.args[2].elts}}
                for c in _calls(setup, "overrideDefaultEntry")]
    registers = []
    for call in _calls(setup, "setRegisterValue"):
        value = _value(call.args[1])
        if isinstance(value, list):  # a struct cell: [(name.member, v), ...]
            members = {k.rsplit(".", 1)[-1]: v for k, v in value}
            order = STRUCT_MEMBERS.get(frozenset(members), list(members))
            value = [members[m] for m in order]
        registers.append({"name": _short(_value(call.args[0])), "index": _value(call.args[2]),
                          "value": value})
    send = _assigned(methods["sendPacket"])
    verify = _assigned(methods["verifyPackets"])
    expect = None
    if "exp_pkt" in verify:
        data = _value(verify["exp_pkt"])
        care = (1 << (8 * len(data))) - 1
        for call in _calls(methods["verifyPackets"], "set_do_not_care"):
            offset, width = _value(call.args[0]), _value(call.args[1])
            hole = ((1 << width) - 1) << (8 * len(data) - offset - width)
            care &= ~hole
        expect = {"port": _value(verify["eg_port"]), "frame": data.hex(),
                  "care": care.to_bytes(len(data), "big").hex()}
    head = "".join(lines[cls.lineno - 1:cls.lineno + 3])  # the comment opens the class
    coverage = re.search(r"# Current statement coverage: ([\d.e-]+)", head)
    return {"name": cls.name, "coverage": float(coverage.group(1)) if coverage else None,
            "port": _value(send["ig_port"]), "frame": _value(send["pkt"]).hex(),
            "entries": entries, "defaults": defaults, "registers": registers,
            "expect": expect}


def _without_traces(lines):
    """The PTF file's lines without each test's trace (a docstring between two lines of
    four spaces and three quotes, up to MBs per test): the tests alone parse in seconds."""
    inside = False
    for line in lines:
        if line.rstrip("\n") == "    '''":
            inside = not inside
        elif not inside:
            yield line


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            source = "".join(_without_traces(f))
        command = open(argv[1]).read()
    except OSError as e:
        print(f"testgen_fixtures: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    lines = source.splitlines(keepends=True)
    tests = [fixture(c, lines) for c in ast.parse(source).body
             if isinstance(c, ast.ClassDef) and re.fullmatch(r"Test\d+", c.name)]
    # One test a line: hundreds of tests stay a readable, diffable file.
    print('{"generator": %s,\n "tests": [' % json.dumps(command.strip().splitlines()))
    print(",\n".join("  " + json.dumps(t, separators=(",", ":")) for t in tests))
    print("]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
