"""The docs' command blocks as tests: read a page's fenced blocks and run them as a user who
pastes them would, in a fresh copy of the tree, in a network namespace of its own.

What runs: every ```sh, ```bash and ```python block, in page order, pasted into one bash
(`bash -s` reading the blocks as they are pasted; a block's background processes live on into
the next, as in a terminal), each once the one before it has finished. Output and data (```text,
```console, ```yaml, ...) never run. A fence without a language is refused on the pages the
tests follow: a reader cannot tell whether to paste it, and neither can the test. An HTML
comment on the lines just above a block's fence steers it (rendered pages do not show it):

    <!-- doc-test: skip: WHY -->       not meant to run here (the test prints WHY)
    <!-- doc-test: twice -->           pasted twice in a row: a second run must work too
    <!-- doc-test: expect: REGEX -->   its output must match REGEX (one marker per pattern)
    <!-- doc-test: wait-for: REGEX --> paste it once the output so far matches REGEX (what a
                                       reader waits to see, e.g. a server saying it listens)
    <!-- doc-test: timeout: SECONDS --> how long the block may take (default 120)
    <!-- doc-test: fails -->           a command in it is meant to fail (shown as an example)

A block fails when one of its commands exits non-zero (bash's ERR trap), when it outlives its
timeout (a `wait` on a server hangs), or when an `expect` does not match. After the page, every
process in the namespace is stopped, then the namespace and the copy are removed.

Run the docs' tests alone:  .venv/bin/python -m pytest tests/test_doc_blocks.py
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"sh": "sh", "bash": "sh", "python": "python"}
MARKER = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")
DEFAULT_TIMEOUT = 120.0


@dataclass
class Block:
    page: str
    line: int            # the opening fence's line, 1-based
    lang: str            # "sh", "python", or "" (output, data: never run)
    text: str
    fence: str = ""      # the language as written after the fence
    skip: str | None = None
    twice: bool = False
    fails: bool = False
    timeout: float = DEFAULT_TIMEOUT
    expect: list[str] = field(default_factory=list)
    wait_for: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class MarkerError(ValueError):
    """A doc-test marker the runner does not know, or one that steers no runnable block."""


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page` with the markers written above it."""
    rel = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
    out: list[Block] = []
    pending: list[tuple[int, str]] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            marks = MARKER.findall(lines[i])
            pending += [(i + 1, s) for s in marks]
            if lines[i].strip() and not marks:
                _orphans(rel, pending)
                pending = []
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        b = Block(rel, start, RUNNABLE.get(m.group(1), ""), "\n".join(body) + "\n", m.group(1))
        for at, mark in pending:
            _apply(b, mark, f"{rel}:{at}")
        if pending and not b.lang:
            raise MarkerError(f"{rel}:{pending[0][0]}: doc-test marker above a block that never "
                              f"runs (```{m.group(1)})")
        pending = []
        out.append(b)
        i += 1
    _orphans(rel, pending)
    return out


def _orphans(rel: str, pending: list[tuple[int, str]]) -> None:
    if pending:
        raise MarkerError(f"{rel}:{pending[0][0]}: doc-test marker not directly above a block")


def _apply(b: Block, mark: str, where: str) -> None:
    key, _, value = mark.partition(":")
    key, value = key.strip(), value.strip()
    if key == "skip" and value:
        b.skip = value
    elif key == "twice" and not value:
        b.twice = True
    elif key == "fails" and not value:
        b.fails = True
    elif key == "expect" and value:
        re.compile(value)
        b.expect.append(value)
    elif key == "wait-for" and value:
        re.compile(value)
        b.wait_for.append(value)
    elif key == "timeout" and value:
        b.timeout = float(value)
    else:
        raise MarkerError(f"{where}: unknown doc-test marker {mark!r} (skip: WHY, twice, fails, "
                          f"expect: REGEX, wait-for: REGEX, timeout: SECONDS)")


def fresh_tree(dest: Path) -> Path:
    """A copy of the committed files of this tree (as a fresh clone has them, with their times)
    plus the compiled C parts, and a `.venv` that is this process's environment: its `bin`
    and `lib` linked, its install stamp new, so `make` targets run as after `make setup`."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for rel in filter(None, files):
        src = ROOT / os.fsdecode(rel)
        if src.is_file():
            (dest / os.fsdecode(rel)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(rel))
    for so in ROOT.glob("*/**/*.so"):
        if ".venv" not in so.parts:
            (dest / so.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, dest / so.relative_to(ROOT))
    venv = Path(sys.prefix)
    (dest / ".venv").mkdir()
    for entry in venv.iterdir():
        if entry.name != ".installed":
            (dest / ".venv" / entry.name).symlink_to(entry)
    (dest / ".venv" / ".installed").touch()
    return dest


@dataclass
class Outcome:
    block: Block
    output: str
    error: str | None  # why it failed, None when it passed


# -m: job control as in a terminal (`kill %1` signals the job's process group); the ERR trap
# names each command that failed, between the sentinels of its block.
PREAMBLE = "set -mE\ntrap 'echo \"@@fail $? $BASH_COMMAND\"' ERR\n"


def _paste(b: Block, n: int, rep: int, work: Path) -> str:
    """What pasting block `n` puts into the shell, between two sentinels."""
    text = b.text
    if b.lang == "python":
        f = work / f"block{n}.py"
        f.write_text(b.text)
        text = f".venv/bin/python {f}\n"
    return f"echo '@@begin {n} {rep}'\n{text}echo '@@end {n} {rep}'\n"


def run_page(page: Path, ns: str, keep: Path | None = None) -> list[Outcome]:
    """Paste `page`'s runnable blocks into one bash in namespace `ns`, each once the one
    before it has finished (and its `wait-for` output has come); one Outcome per pasted block
    (a block run twice has two). Every process is stopped before returning."""
    runnable = [b for b in blocks(page) if b.lang and not b.skip]
    with tempfile.TemporaryDirectory(prefix="spina-doc-") as tmp:
        work = Path(tmp)
        tree = fresh_tree(work / "spina")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPINA_", "PYTEST"))}
        env["PYTHONPATH"] = str(tree)
        shell = subprocess.Popen(["ip", "netns", "exec", ns, "bash", "-s"], cwd=tree, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        reader = _Reader(shell)
        try:
            shell.stdin.write(PREAMBLE.encode())
            outcomes = _feed(runnable, reader, shell, work)
        finally:
            _stop_namespace(ns, shell)
        if keep is not None:
            keep.write_text(reader.text)
    return outcomes


class _Reader:
    """The shell's output as it comes, read up to a line or a deadline (select on the pipe)."""

    def __init__(self, shell: subprocess.Popen):
        self.fd = shell.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.text = ""
        self.closed = False

    def until(self, marker: str, deadline: float) -> bool:
        """Read until `marker` is in the text (True), the pipe closes or the deadline passes."""
        while marker not in self.text:
            if self.closed or not self._more(deadline):
                return False
        return True

    def until_match(self, pattern: str, deadline: float) -> bool:
        """Read until the text so far matches `pattern` (a regex, multi-line)."""
        while not re.search(pattern, self.text, re.M):
            if self.closed or not self._more(deadline):
                return False
        return True

    def _more(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            return False
        chunk = os.read(self.fd, 65536)
        self.closed = not chunk
        self.text += chunk.decode(errors="replace")
        return True


def _feed(runnable: list[Block], reader: _Reader, shell: subprocess.Popen,
          work: Path) -> list[Outcome]:
    """Paste block by block, each within its own timeout; stop at the first that hangs."""
    outcomes: list[Outcome] = []
    for idx, b in enumerate(runnable):
        for rep in range(2 if b.twice else 1):
            deadline = time.monotonic() + b.timeout
            begin, end = f"@@begin {idx} {rep}\n", f"@@end {idx} {rep}\n"
            waited = all(reader.until_match(p, deadline) for p in b.wait_for)
            if waited:
                shell.stdin.write(_paste(b, idx, rep, work).encode())
                shell.stdin.flush()
            done = waited and reader.until(end, deadline)
            body = reader.text.partition(begin)[2].partition(end)[0]
            outcomes.append(Outcome(b, body, _judge(b, body, done, waited, reader, shell)))
            if not done:
                return outcomes
    return outcomes


def _judge(b: Block, body: str, done: bool, waited: bool, reader: _Reader,
           shell: subprocess.Popen) -> str | None:
    """Why the block failed, or None."""
    if not waited:
        return f"the output never matched its wait-for within {b.timeout:g} s"
    if not done:
        return (f"did not finish within {b.timeout:g} s" if not reader.closed
                else f"the shell exited ({shell.wait()}) inside the block")
    fails = [ln[len("@@fail "):] for ln in body.splitlines() if ln.startswith("@@fail ")]
    if fails and not b.fails:
        return "a command failed: " + "; ".join(fails)
    if b.fails and not fails:
        return "marked `fails` but every command succeeded"
    for pattern in b.expect:
        if not re.search(pattern, body, re.M):
            return f"output does not match {pattern!r}"
    return None


def _stop_namespace(ns: str, shell: subprocess.Popen) -> None:
    """SIGTERM to every process in the namespace (the shell's background jobs included), then
    SIGKILL after 15 s: nothing a page started outlives its test."""
    def pids() -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for processes to exit: there is no event to wait on
        if not pids():
            break
    try:
        shell.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(5)
