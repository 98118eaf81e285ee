"""The docs hold together: every relative link resolves, docs/ is pages and the assets a
deployment loads, docs/README.md indexes every page, every results folder says its command.

    .venv/bin/python -m pytest tests/test_doc_links.py -q
"""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
RESULTS = os.path.join(ROOT, "bench", "results")
# docs/ keeps prose and what a user loads into other tools (issue 43): nothing measured.
ASSETS = {"grafana-spina.json", "spina-alerts.yml", "spina.lua"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a command: quoted inline or a line of a code block
COMMAND = re.compile(r"(^|`)(python |torchrun |make |\.venv/bin/)", re.M)


def _markdown_files():
    """Every tracked Markdown file (pages, READMEs, results summaries)."""
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [f for f in out if os.path.exists(os.path.join(ROOT, f))]


def _targets(path):
    """The relative link targets of one Markdown file, anchors dropped."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        yield target.split("#", 1)[0]


def test_every_relative_link_resolves():
    """Each [text](path) and ![alt](path) in a tracked .md names a file or folder that exists."""
    files = _markdown_files()
    assert "README.md" in files and "docs/benchmark.md" in files
    broken = [f"{f}: {t}" for f in files for t in _targets(f)
              if not os.path.exists(os.path.normpath(os.path.join(ROOT, os.path.dirname(f), t)))]
    assert broken == []


def test_docs_hold_only_pages_and_assets():
    """docs/ is prose: .md pages plus the three operational assets, no result dumps."""
    others = {f for f in os.listdir(DOCS) if not f.endswith(".md")}
    assert others == ASSETS


def test_docs_readme_indexes_every_page():
    """docs/README.md links each page of docs/."""
    linked = set(_targets("docs/README.md"))
    pages = {f for f in os.listdir(DOCS) if f.endswith(".md") and f != "README.md"}
    assert pages - linked == set()


def test_every_results_folder_says_its_command():
    """Each folder under bench/results/ that holds results has a README.md or summary.md that
    names a command, itself or its parent (a benchmark's README covers its run subfolders)."""
    missing = []
    for d, _, files in os.walk(RESULTS):
        if not [f for f in files if not f.endswith(".md")]:
            continue
        folders = [d] + ([os.path.dirname(d)] if os.path.dirname(d) != RESULTS else [])
        readmes = [os.path.join(p, n) for p in folders for n in ("README.md", "summary.md")]
        found = [r for r in readmes if os.path.exists(r)]
        if not any(COMMAND.search(open(r).read()) for r in found):
            missing.append(os.path.relpath(d, ROOT))
    assert missing == []
