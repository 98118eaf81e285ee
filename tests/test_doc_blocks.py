"""Every command block of the user-facing pages runs as written (issue 44, Build 2): each page in
a fresh copy of the tree and a network namespace of its own (so the default ports are its own
and another deployment on this machine cannot interfere), its blocks pasted one after another,
twice where the page says a thing can be done again. tests/doc_blocks.py has the markers.

Run just this test:  .venv/bin/python -m pytest tests/test_doc_blocks.py
"""
from __future__ import annotations

import subprocess

import pytest

from spina import netns
from tests.doc_blocks import ROOT, MarkerError, blocks, run_page

# The pages a new user follows, in the order they meet them.
PAGES = ["README.md", "docs/operations.md", "examples/README.md", "controller/README.md",
         "softswitch/README.md"]


def _markdown() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def test_every_page_marker_is_known():
    """Every doc-test marker in every tracked page parses and steers a block that runs."""
    errors = []
    for page in _markdown():
        try:
            blocks(ROOT / page)
        except MarkerError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)


def test_markers_are_read(tmp_path):
    """The parser takes skip, twice, expect, wait-for and timeout from the lines above a fence,
    runs sh, bash and python blocks, and refuses a marker it does not know or one above output."""
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- doc-test: twice -->\n<!-- doc-test: expect: ^sum 4$ -->\n"
                    "```sh\necho sum 4\n```\n\n```\noutput\n```\n<!-- doc-test: skip: why -->\n"
                    "```python\nprint(1)\n```\n<!-- doc-test: timeout: 5 -->\n```bash\ntrue\n```\n")
    b = blocks(page)
    assert [(x.lang, x.twice, x.expect, x.skip, x.timeout) for x in b] == [
        ("sh", True, ["^sum 4$"], None, 120.0), ("", False, [], None, 120.0),
        ("python", False, [], "why", 120.0), ("sh", False, [], None, 5.0)]
    page.write_text("<!-- doc-test: again -->\n```sh\ntrue\n```\n")
    with pytest.raises(MarkerError, match="unknown doc-test marker 'again'"):
        blocks(page)
    page.write_text("<!-- doc-test: twice -->\n```\nout\n```\n")
    with pytest.raises(MarkerError, match="never runs"):
        blocks(page)
    page.write_text("<!-- doc-test: twice -->\nprose\n```sh\ntrue\n```\n")
    with pytest.raises(MarkerError, match="not directly above"):
        blocks(page)


def _namespace_or_skip():
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(f"the docs' blocks run in a namespace of their own: {why}")


def test_runner_catches_failures_hangs_and_mismatches(tmp_path):
    """A failing command, a block that outlives its timeout and an unmatched expect each fail
    their block; a `fails` block must fail; background processes are stopped afterwards."""
    _namespace_or_skip()
    page = tmp_path / "p.md"
    page.write_text("<!-- doc-test: twice -->\n```sh\nsleep 300 &\necho ok\n```\n"
                    "```sh\n(sleep 1; echo ready) &\n```\n"
                    "<!-- doc-test: wait-for: ^ready$ -->\n```sh\necho after ready\n```\n"
                    "<!-- doc-test: expect: ^nope$ -->\n```sh\necho yes\n```\n"
                    "```sh\nfalse\necho after\n```\n"
                    "<!-- doc-test: fails -->\n```sh\nls /nonexistent-path\n```\n"
                    "<!-- doc-test: fails -->\n```sh\ntrue\n```\n"
                    "<!-- doc-test: timeout: 1 -->\n```sh\nsleep 30\n```\n")
    tag = netns.unique_tag("dt")
    with netns.Network() as net:
        ns = net.namespace(f"{tag}-a")
        out = run_page(page, ns)
        assert subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout == ""
    errors = [o.error for o in out]
    assert errors[:5] == [None, None, None, None, "output does not match '^nope$'"]
    assert errors[5].startswith("a command failed: 1 false"), errors[5]
    assert errors[6:] == [None, "marked `fails` but every command succeeded",
                          "did not finish within 1 s"]
    assert out[0].output.splitlines() == ["ok"] and "after" in out[5].output
    assert out[3].output.splitlines() == ["after ready"]


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page, capsys):
    """The page's runnable blocks, pasted in order (twice where marked), each succeed."""
    _namespace_or_skip()
    bs = blocks(ROOT / page)
    bare = [b.where for b in bs if not b.fence]
    assert not bare, f"fences without a language (sh to run, text for output): {bare}"
    with capsys.disabled():
        for b in bs:
            if b.skip:
                print(f"\n  {b.where}: not run: {b.skip}", end="")
    runnable = [b for b in bs if b.lang and not b.skip]
    assert bs, f"{page} has no command blocks: drop it from PAGES"
    tag = netns.unique_tag("doc")
    with netns.removing_leftovers(tag) as left, netns.Network() as net:
        outcomes = run_page(ROOT / page, net.namespace(f"{tag}-page"))
    failed = [f"{o.block.where} ({o.block.lang}): {o.error}\n{o.output[-3000:]}"
              for o in outcomes if o.error]
    assert not failed, "\n\n".join(failed)
    assert len(outcomes) == sum(2 if b.twice else 1 for b in runnable)
    assert not left


def test_make_demo_as_written(tmp_path):
    """README's first command, `make demo` as its quick start writes it, ends in PASS (the
    quick-start block itself is skipped: its other command is this suite)."""
    _namespace_or_skip()
    quick = next(b for b in blocks(ROOT / "README.md") if "make demo" in b.text)
    line = next(ln for ln in quick.text.splitlines() if ln.startswith("make demo"))
    page = tmp_path / "demo.md"
    page.write_text(f"<!-- doc-test: expect: ^PASS: 4 densities -->\n"
                    f"<!-- doc-test: timeout: 300 -->\n```sh\n{line}\n```\n")
    tag = netns.unique_tag("doc")
    with netns.removing_leftovers(tag) as left, netns.Network() as net:
        (out,) = run_page(page, net.namespace(f"{tag}-demo"))
    assert out.error is None, f"{out.error}\n{out.output[-3000:]}"
    assert not left
