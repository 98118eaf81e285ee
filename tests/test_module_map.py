"""The imports follow docs/architecture.md's module map: lower layers never import higher ones.

Run just this file: python -m pytest tests/test_module_map.py
Every import statement of the layered packages is read (also imports inside functions), and
every `#include "..."` of their C sources and headers (resolved against the including file's
folder); an import or include the map does not allow fails naming the file, the line and the
package it reaches into.
"""
from __future__ import annotations

import ast
import pathlib
import posixpath
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = {"spina", "softswitch", "controller", "host_agent", "ps", "testbed", "bmv2_tests",
        "spina_cli", "bench", "tests", "examples", "collectives"}
# package -> the packages of ours it may import (itself always)
ALLOWED = {
    "spina": set(),
    "softswitch": {"spina"},
    "controller": {"spina"},
    "host_agent": {"spina"},
    "ps": {"spina"},
    "collectives": {"spina"},
    "testbed": {"spina", "controller"},
    "bmv2_tests": {"spina", "controller", "softswitch"},
}
# (file, package it may import besides): docs/architecture.md says why each exists
EXCEPTIONS = {
    ("host_agent/launch.py", "softswitch"),
    ("host_agent/local.py", "softswitch"),
    ("softswitch/__main__.py", "controller"),
    ("ps/topk.py", "host_agent"),
    ("host_agent/hooks/collective.py", "collectives"),
}


def imported_packages(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


_INCLUDE = re.compile(r'\s*#\s*include\s*"([^"]+)"')
C_SUFFIXES = (".c", ".h")


def included_packages(rel: str, source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every `#include "..."` in the C file `rel`; a path that
    leaves the repository is reported as the package '..'."""
    out = []
    for n, text in enumerate(source.splitlines(), 1):
        m = _INCLUDE.match(text)
        if m:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), m.group(1)))
            out.append((n, ".." if target.startswith("../") else target.split("/")[0]))
    return out


def dependencies(rel: str, source: str) -> tuple[str, list[tuple[int, str]]]:
    """How file `rel` reaches other packages ("imports" or "includes") and (line, package)."""
    if rel.endswith(C_SUFFIXES):
        return "includes", included_packages(rel, source)
    return "imports", imported_packages(source)


def violations(package: str, rel: str, source: str) -> list[str]:
    allowed = ALLOWED[package] | {package}
    verb, found = dependencies(rel, source)
    return [f"{rel}:{line}: {verb} {pkg} ({package} may {verb[:-1]} only "
            f"{', '.join(sorted(allowed))})"
            for line, pkg in found
            if (pkg in OURS or pkg == "..") and pkg not in allowed and (rel, pkg) not in EXCEPTIONS]


def test_imports_follow_the_module_map():
    found = []
    for package in ALLOWED:
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, f"{package}/ has no Python files: is the map out of date?"
        files += sorted(f for suffix in C_SUFFIXES for f in (ROOT / package).rglob("*" + suffix))
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            found += violations(package, rel, f.read_text())
    assert not found, "\n".join(found)


def test_checker_catches_an_upward_import():
    """The checker itself: an upward import, also one inside a function, is reported."""
    src = ("import numpy\nfrom spina import wire\n\n"
           "def f():\n    from host_agent.agent import Agent\n")
    assert violations("controller", "controller/x.py", src) == [
        "controller/x.py:5: imports host_agent (controller may import only controller, spina)"]
    assert violations("spina", "spina/x.py", "import softswitch.udp\n") == [
        "spina/x.py:1: imports softswitch (spina may import only spina)"]


def test_checker_catches_an_include_across_packages():
    """The checker reads C includes too: one into another package's folder is reported, one
    into spina/ or its own package's folders is not, nor a system header."""
    src = ('#include <Python.h>\n#include "../spina/_wire.h"\n#include "_core.h"\n'
           '  #  include "../host_agent/_pybuf.h"\n#include "../../outside.h"\n')
    assert violations("softswitch", "softswitch/_x.c", src) == [
        "softswitch/_x.c:4: includes host_agent (softswitch may include only softswitch, spina)",
        "softswitch/_x.c:5: includes .. (softswitch may include only softswitch, spina)"]
    assert violations("host_agent", "host_agent/compression/_k.c",
                      '#include "../../spina/_pybuf.h"\n#include "../_core.h"\n') == []


def test_every_exception_is_still_needed():
    """An exception nobody uses any more is removed from the map (and from the docs)."""
    for rel, pkg in EXCEPTIONS:
        pkgs = {p for _, p in dependencies(rel, (ROOT / rel).read_text())[1]}
        assert pkg in pkgs, f"{rel} no longer imports {pkg}: drop the exception here and in docs"
