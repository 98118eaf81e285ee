"""`spina status --watch SECONDS`: a live per-job table of the switches' counters.

On a terminal the table is redrawn in place (the terminal's own clear sequence, from curses'
terminfo) with each counter's rate since the last poll; anywhere else (a pipe, a log file)
every poll prints plain `key=value` lines, one per job, so the output stays greppable.
"""
from __future__ import annotations

import argparse
import sys
import time

from controller.controller import Controller, format_table
from controller.p4rt import P4RuntimeError
from controller.state import load
from spina import cli, log as spina_log
from spina.config import ConfigError


def _parser() -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(
        prog="spina status --watch",
        description="Poll every switch's per-job counters over P4Runtime every SECONDS and "
                    "redraw them as a table (on a terminal, with per-second rates) or print "
                    "one key=value line per job and poll (otherwise). Ctrl-C stops.")
    ap.add_argument("-c", "--config", default="spina.yaml", metavar="FILE",
                    help="desired-state YAML (default %(default)s)")
    ap.add_argument("--watch", type=cli.positive_float, required=True, metavar="SECONDS",
                    help="poll interval")
    ap.add_argument("--count", type=cli.int_range(1, 1 << 62), metavar="N",
                    help="stop after N polls (default: never)")
    ap.add_argument("--timeout", type=cli.positive_float, default=10.0,
                    help="seconds to wait for a switch (default %(default)s)")
    spina_log.add_options(ap, level="WARNING")
    return ap


def _clear_sequence(out) -> str:
    """The terminal's clear-screen sequence, or '' when `out` is not a terminal."""
    if not out.isatty():
        return ""
    try:
        import curses
        curses.setupterm(fd=out.fileno())
        seq = curses.tigetstr("clear")
        return seq.decode() if seq else "\x1b[H\x1b[2J"
    except Exception:  # no terminfo for $TERM: the ANSI sequence every terminal knows
        return "\x1b[H\x1b[2J"


def with_rates(rows: list[dict], prev: dict, dt: float) -> list[dict]:
    """Rows plus `<counter>/s` columns for job_received and job_results since `prev`."""
    out = []
    for r in rows:
        r = dict(r)
        key = (r.get("switch"), r.get("job"))
        for c in ("job_received", "job_results"):
            if c in r and key in prev and dt > 0:
                r[c + "/s"] = f"{(r[c] - prev[key].get(c, 0)) / dt:.0f}"
        out.append(r)
    return out


def watch(config: str, interval: float, count: int | None = None, out=None,
          timeout: float = 10.0) -> int:
    out = out or sys.stdout
    clear = _clear_sequence(out)
    polls, prev, t_prev = 0, {}, None
    # Read-only: no election id, so it never contests primary with `serve` or a deploy.
    with Controller(load(config), None, timeout=timeout) as ctl:
        while count is None or polls < count:
            now = time.time()
            try:
                rows = ctl.status()
                err = None
            except (P4RuntimeError, OSError) as e:
                rows, err = [], str(e)
                ctl.close()  # reconnect next poll
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
            if clear:
                table = format_table(with_rates(rows, prev, now - t_prev if t_prev else 0))
                out.write(f"{clear}spina status  {config}  every {interval:g}s  {stamp}\n\n"
                          f"{table}\n" + (f"\nerror: {err}\n" if err else ""))
            else:
                for r in rows:
                    out.write(f"time={stamp} " + " ".join(f"{k}={v}" for k, v in r.items()) + "\n")
                if err:
                    out.write(f"time={stamp} error={err!r}\n")
            out.flush()
            prev = {(r.get("switch"), r.get("job")): r for r in rows}
            t_prev, polls = now, polls + 1
            if count is None or polls < count:
                time.sleep(interval)
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    spina_log.setup("status", args.log_level, args.log_format)
    try:
        return watch(args.config, args.watch, args.count, timeout=args.timeout)
    except KeyboardInterrupt:
        return 0
    except (ConfigError, P4RuntimeError, OSError) as e:
        return cli.fail("spina status", e)
