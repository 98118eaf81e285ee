"""Waiting in tests: for a condition another thread or process makes true, never for a time.

`until` polls a condition and returns its first true value; past its timeout (a bound on a
hang, not a speed check) it fails naming what it waited for.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def until(cond: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.02) -> T:
    """The first true value of `cond()`, polled every `every` s; AssertionError naming `what`
    when none came within `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def file_appears(path: Path, timeout: float = 30.0) -> None:
    """Until `path` exists."""
    until(Path(path).exists, f"{path} to appear", timeout)
