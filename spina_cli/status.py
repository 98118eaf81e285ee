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


def parser(prog: str = "spina status") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(
        prog=prog,
        description="Poll every switch's per-job counters over P4Runtime every SECONDS and "
                    "redraw them as a table (on a terminal, with per-second rates) or print "
                    "one key=value line per job and poll (otherwise). Ctrl-C stops.")
    ap.add_argument("-c", "--config", metavar="FILE", type=cli.input_file,
                    help="desired-state YAML (default spina.yaml)")
    ap.add_argument("--watch", type=cli.positive_float, required=True, metavar="SECONDS",
                    help="poll interval")
    ap.add_argument("--count", type=cli.int_range(1), metavar="N",
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


# The terminal table's columns: (its header, the status row's key); 100 columns wide with a
# job id of 4 digits and a switch name of up to 14 characters (`spina status` prints every
# counter in full).
SCREEN = (("job", "job"), ("switch", "switch"), ("level", "level"), ("ok", "installed"),
          ("recv", "job_received"), ("recv/s", "job_received/s"), ("results", "job_results"),
          ("res/s", "job_results/s"), ("dup", "job_duplicates"), ("stale", "job_stale"),
          ("held", "job_held"), ("cdrop", "job_congestion_drops"))
LEGEND = ("recv job_received, results job_results (copies sent), dup job_duplicates, stale "
          "job_stale,\nheld job_held, cdrop job_congestion_drops; /s: per second since the last "
          "poll; k M G: 1e3 1e6 1e9")


def compact(value) -> str:
    """A counter in at most 6 characters: 12345 -> 12.3k, 1234567890 -> 1.23G."""
    if not isinstance(value, int) or abs(value) < 100_000:
        return str(value)
    for unit, size in (("k", 1e3), ("M", 1e6), ("G", 1e9)):
        v = value / size
        if abs(v) < 999.5:  # three digits once rounded
            return f"{v:.3g}{unit}"
    return f"{value / 1e9:.0f}G"


def screen_rows(rows: list[dict]) -> list[dict]:
    """The terminal table's rows: SCREEN's columns that the rows have, counters compacted."""
    out = []
    for r in rows:
        row = {}
        for head, key in SCREEN:
            if key in r:
                v = r[key]
                row[head] = compact(int(v)) if key.startswith("job_") else v
        out.append(row)
    return out


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
                table = format_table(screen_rows(with_rates(rows, prev,
                                                            now - t_prev if t_prev else 0)))
                out.write(f"{clear}spina status  {config}  every {interval:g}s  {stamp}\n\n"
                          f"{table}\n\n{LEGEND}\n" + (f"\nerror: {err}\n" if err else ""))
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


def main(argv=None, prog: str = "spina status") -> int:
    ap = parser(prog)
    args = ap.parse_args(argv)
    spina_log.setup("status", args.log_level, args.log_format)
    try:
        return watch(args.config or "spina.yaml", args.watch, args.count, timeout=args.timeout)
    except KeyboardInterrupt:
        return 0
    except (ConfigError, P4RuntimeError, OSError) as e:
        return cli.fail(ap.prog, e)
