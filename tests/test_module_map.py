"""The imports follow docs/architecture.md's module map: lower layers never import higher ones.

Run just this file: python -m pytest tests/test_module_map.py
Every import statement of the layered packages is read (also imports inside functions), and
every `#include "..."` of their C sources and headers (resolved against the including file's
folder); an import or include the map does not allow fails naming the file, the line and the
package it reaches into. No module imports itself through others (an import circle), not even
lazily inside a function, and none takes another module's private names.
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


def module_imports(modules: dict[str, str]) -> dict[str, set[str]]:
    """{module: the modules of `modules` it imports} for {dotted name: source}; `from P import
    N` imports the module P.N when there is one, else P. Imports inside functions count: a lazy
    import that closes a circle is still a circle."""
    out = {}
    for name, source in modules.items():
        got = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                got.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                got.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names)
        out[name] = {m for m in got if m in modules and m != name}
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one
    module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


# Circles that came in with other changes, left to their owners (named in the report of the
# change that added this test): no other may appear, nor may these grow.
CIRCLES_LEFT: list[list[str]] = []


def test_no_import_circle():
    """No module of ours reaches itself through its imports (lazy ones included)."""
    modules = {}
    for package in sorted(OURS):
        for f in sorted((ROOT / package).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f.read_text()
    assert "controller.controller" in modules and "spina.config" in modules
    found = [c for c in circles(module_imports(modules)) if c not in CIRCLES_LEFT]
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_checker_catches_a_circle():
    """The circle checker itself: a circle closed by a lazy import inside a function is found,
    a chain without one is not."""
    modules = {"p.a": "from p.b import f\n",
               "p.b": "import p.c\n",
               "p.c": "def g():\n    from p import a\n",
               "p.d": "from p import a\n",
               "p": ""}
    graph = module_imports(modules)
    assert graph == {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "p": set()}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]
    modules["p.c"] = "def g():\n    pass\n"
    assert circles(module_imports(modules)) == []


def private_imports(rel: str, source: str, modules: set[str]) -> list[str]:
    """`from X import _name` in `source` (the file `rel`) where `_name` is a private name of
    another module of ours, not a module itself (a compiled extension such as host_agent._core is a
    module: importing it is no reach into another module's insides)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__") \
                        and node.module.split(".")[0] in OURS and full not in modules:
                    out.append(f"{rel}:{node.lineno}: imports {node.module}'s private {a.name}")
    return out


def test_no_module_imports_another_modules_private_names():
    """No module of the packages takes a private name (`_x`) from another module: what two
    modules share is public in its owner."""
    found = []
    for package in sorted(set(ALLOWED) | {"spina_cli"}):
        files = sorted((ROOT / package).rglob("*.py"))
        modules = {".".join(f.relative_to(ROOT).with_suffix("").parts) for f in files}
        # compiled extensions: their C sources or built modules sit beside the Python files
        modules |= {".".join(f.relative_to(ROOT).parts).split(".cpython")[0].removesuffix(".c")
                    for f in (ROOT / package).rglob("_*.c")}
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            found += private_imports(rel, f.read_text(), modules)
    assert not found, "\n".join(found)


def test_checker_catches_a_private_import():
    """The private-import checker itself: a private function is reported, a private module
    (an extension), a dunder and another project's private name are not."""
    src = ("from controller.p4rt import Connection, _rpc\n"
           "from host_agent import _core\nfrom spina import __version__\n"
           "from torch._C import _private\n")
    assert private_imports("controller/x.py", src, {"host_agent._core"}) == [
        "controller/x.py:1: imports controller.p4rt's private _rpc"]
