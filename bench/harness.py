"""The one benchmark harness, the nccl-tests way: what every WHAT shares, written once.

    python -m bench WHAT [-b SIZE -e SIZE -f FACTOR] [-d DENSITIES] [-g WORKERS] [-l LANE_BITS]
                         [-m METHODS] [-n REPEATS] [-t TOPOLOGY] [--rates RATES] [--name NAME]
    spina bench WHAT ...                       # the same

WHAT is one of `WHATS` (bench/README.md lists them); each is a module of this package with a
`run(opts, log)` that yields its rows. The harness owns:

- the options (`parser`): the same names and meanings for every WHAT; a WHAT declares its
  methods, its defaults and, rarely, options of its own;
- the sizes: -b begin, -e end, -f factor, in bytes of the float32 tensor (K, M, G: 1024-based,
  as nccl-tests), elements = bytes / 4;
- the columns (`COLUMNS`): one row per point and method; time is the median over the paired
  repeats of the slowest rank, algbw = size / time, busbw = algbw x the collective's bus factor
  (`BUS_FACTOR`: nccl-tests' definitions, applied to every method, SpINA's too), vs_gloo and
  vs_floor the median over repeats of this method's time over gloo's (the floor's) in the same
  repeat; bytes_per_link what one rank sent on its link per call; wrong the results outside
  their check (nccl-tests' #wrong; a run with any exits 1 after writing everything); load the
  1-minute load average at the point's start and end. A WHAT's own measurements follow as
  extra columns (`EXTRA_COLUMNS` of its module);
- the output folder bench/results/<name>/ (`Results`): results.csv (rewritten after every
  point, so a stopped run keeps what it measured), plot.png, summary.md and command.txt (the
  exact command, commit, date, machine and load).
"""
from __future__ import annotations

import argparse
import csv
import importlib
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from spina import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")

# WHAT -> module of this package (each: DESCRIPTION, METHODS, DEFAULTS, run; see the docstring)
WHATS = {w: f"bench.{w}" for w in (
    "agent", "all_gather", "all_reduce", "dlcp", "first_touch", "fsdp", "hier", "hier_gather",
    "l2", "lanes", "loss", "overlap", "plan", "profile", "reduce_scatter", "scale_out",
    "switch", "training")}

# nccl-tests' bus bandwidth factors (its doc/PERFORMANCE.md), by collective, for n ranks.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n,
              "none": lambda n: 1.0}

COLUMNS = ("what", "method", "size", "elements", "dtype", "density", "workers", "lane_bits",
           "rate", "repeats", "time_us", "time_min_us", "time_max_us", "algbw_GBps",
           "busbw_GBps", "vs_gloo", "vs_floor", "bytes_per_link", "wrong", "load")

_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMG]?)(i?B)?\s*", re.I)


def parse_size(text: str) -> int:
    """'64K', '1M', '8MiB', '65536' -> bytes (K, M, G are 1024-based, as nccl-tests')."""
    m = _SIZE.fullmatch(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a size: a positive number of bytes, optionally "
                         "with K, M or G")
    return int(float(m.group(1)) * 1024 ** " KMG".index(m.group(2).upper() or " "))


def sizes(begin: int, end: int, factor: float) -> list[int]:
    """begin, begin*factor, ... up to end (nccl-tests' -b -e -f), each a multiple of 4 bytes."""
    if end < begin:
        raise ValueError(f"-e/--end {end} is below -b/--begin {begin}")
    out, s = [], begin
    while s <= end:
        out.append(max(4, int(s) // 4 * 4))
        if factor <= 1:
            break
        s *= factor
    return out


_list = cli.comma_list  # an argparse type: a comma list of `kind` values


@dataclass
class What:
    """A WHAT: its module and what it declares."""
    name: str
    module: object
    methods: tuple = field(init=False)

    def __post_init__(self):
        self.methods = tuple(self.module.METHODS)


def load(name: str) -> What:
    return What(name, importlib.import_module(WHATS[name]))


def parser(what: What, prog: str | None = None) -> argparse.ArgumentParser:
    """The options every WHAT takes (its DEFAULTS fill in the defaults), plus its own."""
    d = dict(begin="64K", end="4M", factor=4.0, densities="1,0.01", workers="4",
             lane_bits="32", methods=",".join(what.methods), repeats=5, topology=None,
             rates=None) | dict(what.module.DEFAULTS)
    ap = cli.ArgumentParser(prog=prog or f"python -m bench {what.name}",
                            description=what.module.DESCRIPTION)
    ap.add_argument("-b", "--begin", type=cli.parsed_by(parse_size, "size", bad=("x", "0")),
                    default=d["begin"], help=f"first size in bytes (default {d['begin']})")
    ap.add_argument("-e", "--end", type=cli.parsed_by(parse_size, "size", bad=("x", "0")),
                    default=d["end"], help=f"last size in bytes (default {d['end']})")
    ap.add_argument("-f", "--factor", type=cli.positive_float, default=d["factor"],
                    help="size factor from one point to the next (default %(default)s)")
    ap.add_argument("-d", "--densities", type=_list(cli.fraction, "densities"),
                    default=d["densities"],
                    help="comma list: fractions of each rank's data blocks non-zero "
                    "(default %(default)s)")
    ap.add_argument("-g", "--workers", type=_list(cli.int_range(1, 250), "workers"),
                    default=d["workers"], help="comma list of rank counts (default %(default)s)")
    ap.add_argument("-l", "--lane-bits", type=_list(_lane_bits, "lane bits"),
                    default=d["lane_bits"],
                    help="comma list of SpINA lane widths, 32, 16, 8 (default %(default)s)")
    ap.add_argument("-m", "--methods", type=_list(_method(what), "methods"),
                    default=d["methods"],
                    help=f"comma list of {', '.join(what.methods)}".replace("%", "%%")
                    + " (default %(default)s)")
    ap.add_argument("-n", "--repeats", type=cli.int_range(1, 10_000), default=d["repeats"],
                    help="paired repeats per point, after one warm-up (default %(default)s)")
    ap.add_argument("-t", "--topology", default=d["topology"], type=cli.input_file,
                    help="topology file (bench/topologies/): the network the ranks run on, "
                    "built in namespaces (root); default: " + (d["topology"] or "loopback"))
    ap.add_argument("--rates", type=_list(_rate, "rates"), default=d["rates"],
                    help="comma list of link rates (tc's units: 1gbit) overriding the "
                    "topology's, each a point (default: the file's)")
    ap.add_argument("--tag", default=None, type=cli.name,
                    help="prefix of the namespaces' names (default: a unique one)")
    ap.add_argument("--name", type=_name, default=what.name,
                    help="results folder bench/results/NAME, NAME a benchmark's folder and "
                    "optionally /RUN (default %(default)s)")
    ap.add_argument("--out", default=None, type=cli.output_dir,
                    help="results folder (default bench/results/NAME)")
    ap.add_argument("--no-plots", action="store_true", help="write no plot.png")
    if hasattr(what.module, "add_options"):
        what.module.add_options(ap)
    return ap


@cli.refuses("", "a/b/c", "../x")
def _name(text: str) -> str:
    """--name: one or two path segments of letters, digits, _ . - (bench/results/NAME)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not BENCHMARK or BENCHMARK/RUN "
                                         "(letters, digits, _ . -)")
    return text


@cli.refuses("12", "x")
def _lane_bits(text: str) -> int:
    from spina.wire import LANE_BITS
    if text.strip() not in {str(b) for b in LANE_BITS}:
        raise argparse.ArgumentTypeError(f"{text!r} is not a lane width "
                                         f"({', '.join(map(str, LANE_BITS))})")
    return int(text)


@cli.refuses("x", "0mbit")
def _rate(text: str) -> str:
    from spina.topology import parse_rate
    try:
        parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip()


def _method(what: What):
    def parse(text: str) -> str:
        if text not in what.methods:
            raise argparse.ArgumentTypeError(f"{text!r} is not a method of {what.name} "
                                             f"({', '.join(what.methods)})")
        return text
    return cli.refuses("no-such-method")(parse)


def command_parser(prog: str = "python -m bench") -> argparse.ArgumentParser:
    """Every WHAT's parser as a subcommand of `prog` (tests/test_bad_input.py walks them)."""
    ap = cli.ArgumentParser(prog=prog)
    sub = ap.add_subparsers(dest="what", required=True)
    for name in WHATS:
        sub.add_parser(name, parents=[parser(load(name), f"{prog} {name}")], add_help=False)
    return ap


def parse_args(what: What, argv, prog: str | None = None) -> argparse.Namespace:
    ap = parser(what, prog)
    a = ap.parse_args(argv)
    try:
        a.sizes = sizes(a.begin, a.end, a.factor)
    except ValueError as e:
        ap.error(str(e))
    if a.topology is not None:
        from spina.topology import TopologyError, load as load_topology
        try:
            a.topo = load_topology(a.topology)
        except (OSError, TopologyError) as e:
            ap.error(f"argument -t/--topology: {cli.one_line(e)}")
    else:
        a.topo = None
    if a.tag is None:
        from spina.netns import unique_tag
        a.tag = unique_tag("b")
    a.out = a.out or os.path.join(RESULTS, a.name)
    a.what = what.name
    if hasattr(what.module, "check_options"):
        err = what.module.check_options(a)
        if err:
            ap.error(err)
    return a


# ----------------------------------------------------------------------------- rows
def load_text(v) -> str:
    return f"{v[0]:.2f}"


def method_rows(what: str, point: dict, times: dict, *, bus: str, sent: dict | None = None,
                wrong: dict | None = None, load: str = "", extras: dict | None = None) -> list:
    """One row per method of one point: `times` {method: [seconds per paired repeat]},
    `sent` {method: bytes one rank sent on its link per call}, `wrong` {method: count},
    `extras` {method: {extra column: value}}; point: size (bytes), elements, dtype, density,
    workers, lane_bits, rate. Ratios pair repeat i of a method with repeat i of gloo's and
    the floor's (the methods ran in the same repeats)."""
    n = point["workers"]
    gloo = next((m for m in times if m.startswith("gloo")), None)
    rows = []
    for m, t in times.items():
        med = statistics.median(t)
        algbw = point["size"] / med / 1e9 if med > 0 else float("nan")
        rows.append(dict(point, what=what, method=m, repeats=len(t), time_us=round(med * 1e6, 1),
                         time_min_us=round(min(t) * 1e6, 1), time_max_us=round(max(t) * 1e6, 1),
                         algbw_GBps=_sig(algbw), busbw_GBps=_sig(algbw * BUS_FACTOR[bus](n)),
                         vs_gloo=_ratio(t, times.get(gloo)) if m != gloo else "",
                         vs_floor=_ratio(t, times.get("floor")) if m != "floor" else "",
                         bytes_per_link=(sent or {}).get(m, ""),
                         wrong=(wrong or {}).get(m, 0), load=load)
                    | (extras or {}).get(m, {}))
    return rows


def _ratio(a, b) -> str | float:
    """Median over the repeats both ran (training's methods stop at different steps) of
    a's time over b's in the same repeat."""
    if not b:
        return ""
    from bench.paired import paired_ratios
    k = min(len(a), len(b))
    return _sig(statistics.median(paired_ratios(a[:k], b[:k])))


def _sig(x: float) -> float:
    """x to 4 significant digits (bandwidths and ratios span many decades)."""
    return float(f"{x:.4g}")


# ----------------------------------------------------------------------------- output
def commit() -> str:
    """HEAD of the tree the bench ran from, '+dirty' if it had changes."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def run_head(command: str) -> list[str]:
    """A run's first lines (command.txt, summary.md): what ran, from which tree, when, where."""
    return [f"command: {command}", f"commit: {commit()}",
            f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
            f"machine: {platform.node()}, {os.cpu_count()} cores, Linux "
            f"{platform.release()}, Python {platform.python_version()}"]


def load_line(when: str, load=None) -> str:
    """`load at <when>: 1m 5m 15m` (now when `load` is None), as command.txt records it."""
    return f"load at {when}: {' '.join(f'{x:.2f}' for x in (load or os.getloadavg()))}"


class Results:
    """bench/results/<name>/: results.csv, plot.png, summary.md, command.txt."""

    def __init__(self, a, argv, columns, point_columns=()):
        self.a, self.columns, self.point_columns, self.rows = a, columns, point_columns, []
        os.makedirs(a.out, exist_ok=True)
        self.t0, self.load0 = time.time(), os.getloadavg()
        self.command = "python -m bench " + shlex.join([a.what] + list(argv))
        self.head = run_head(self.command)
        self._write_command(end=None)

    @property
    def csv_path(self) -> str:
        return os.path.join(self.a.out, "results.csv")

    def _write_command(self, end) -> None:
        lines = self.head + [load_line("start", self.load0)]
        if end is not None:
            lines += [load_line("end", end),
                      f"seconds: {time.time() - self.t0:.0f}"]
        with open(os.path.join(self.a.out, "command.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def add(self, rows: list[dict]) -> None:
        self.rows += rows
        with open(self.csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, self.columns, extrasaction="raise")
            w.writeheader()
            w.writerows(self.rows)

    def finish(self, plots: bool, finish=None) -> list[str]:
        """Write summary.md, command.txt's end and the plot; `finish(rows, a)`: a WHAT's own
        further outputs (their paths)."""
        self._write_command(end=os.getloadavg())
        files = [self.csv_path, os.path.join(self.a.out, "summary.md"),
                 os.path.join(self.a.out, "command.txt")]
        with open(files[1], "w") as f:
            f.write(summary(self.a.what, self.rows, self.head, self.point_columns))
        if plots and self.rows:
            files.append(plot(self.rows, os.path.join(self.a.out, "plot.png"),
                              self.point_columns))
        return files + (finish(self.rows, self.a) if finish else [])


GROUP = ("workers", "lane_bits", "rate", "density")  # a table and a plot panel each


def page_head(title: str, meta: dict, targets_title: str, targets: list[str],
              none_run: str) -> list[str]:
    """The first lines of a WHAT's own summary beside the harness's (overlap_summary.md,
    dlcp_summary.md): title, the run's meta, the targets met or not."""
    return ([f"# {title}", ""] + [f"- {k}: {v}" for k, v in meta.items()]
            + ["", f"## {targets_title}", ""] + (targets or [f"- ({none_run})"]))


def _groups(rows: list[dict], extra=()) -> dict[tuple, list[dict]]:
    """Rows by GROUP and a WHAT's own point columns (its POINT_COLUMNS: loss, ...)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple((k, r[k]) for k in GROUP + tuple(extra)), []).append(r)
    return out


def _title(key: tuple) -> str:
    d = dict(key)
    return ", ".join([f"{d.pop('workers')} workers", f"{d.pop('lane_bits')}-bit lanes",
                      d.pop("rate") or "loopback"] + [f"{k} {v}" for k, v in d.items()])


def _code_command(line: str) -> str:
    key, sep, value = line.partition("command: ")
    return f"{key}{sep}`{value}`" if sep and not key else line


def summary(what: str, rows: list[dict], head: list[str], extra=()) -> str:
    """summary.md: the command lines, then per group (GROUP and the WHAT's point columns) a
    table of sizes x methods in the common columns."""
    # the command in backticks: docs' tests find a results folder's command so
    out = [f"# bench {what}", ""] + [f"- {_code_command(h)}" for h in head] + [""]
    cols = ("size", "elements", "method", "time_us", "algbw_GBps", "busbw_GBps", "vs_gloo",
            "vs_floor", "bytes_per_link", "wrong", "load")
    for key, rs in _groups(rows, extra).items():
        out += [f"## {_title(key)}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rs]
        out.append("")
    wrong = sum(int(r["wrong"]) for r in rows)
    out.append(f"#wrong: {wrong}" + ("" if not wrong else " (FAILED)"))
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str, extra=()) -> str:
    """plot.png: time and busbw against size, a line per method, a panel pair per group."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = _groups(rows, extra)
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3.2 * len(groups)), squeeze=False)
    for (key, rs), (ax_t, ax_b) in zip(groups.items(), axes):
        for m in dict.fromkeys(r["method"] for r in rs):
            pts = sorted((r["size"], r["time_us"], r["busbw_GBps"]) for r in rs
                         if r["method"] == m)
            xs = [p[0] for p in pts]
            ax_t.plot(xs, [p[1] for p in pts], "o-", label=m)
            ax_b.plot(xs, [p[2] for p in pts], "o-", label=m)
        for ax, y in ((ax_t, "time (us)"), (ax_b, "busbw (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(y)
            ax.set_title(_title(key), fontsize=9)
            ax.grid(alpha=0.3)
        ax_t.set_yscale("log")
        ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def table_line(r: dict) -> str:
    """The console line of a row, nccl-tests' table."""
    return (f"{r['size']:>12} {r['elements']:>10} {r['dtype']:>8} {r['density']:>7g} "
            f"{r['lane_bits']:>4} {r['method']:>16} {r['time_us']:>11.1f} {r['algbw_GBps']:>8.3f} "
            f"{r['busbw_GBps']:>8.3f} {_fmt(r['vs_gloo']):>7} {_fmt(r['vs_floor']):>7} "
            f"{r['wrong']:>6}")


TABLE_HEAD = (f"{'size':>12} {'count':>10} {'type':>8} {'density':>7} {'bits':>4} "
              f"{'method':>16} "
              f"{'time(us)':>11} {'algbw':>8} {'busbw':>8} {'/gloo':>7} {'/floor':>7} "
              f"{'#wrong':>6}")


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


# ----------------------------------------------------------------------------- main
def usage() -> str:
    width = max(map(len, WHATS))
    return ("usage: python -m bench WHAT [options]   (spina bench WHAT ...)\n\nWHAT:\n"
            + "\n".join(f"  {w:<{width}}  {importlib.import_module(m).DESCRIPTION}"
                        for w, m in WHATS.items())
            + "\n\n'python -m bench WHAT --help' lists the options (the same for every WHAT).")


def main(argv=None, prog: str = "python -m bench") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] not in WHATS:
        return cli.fail(prog, f"WHAT: unknown {argv[0]!r} (one of "
                        f"{', '.join(WHATS)})")
    what = load(argv[0])
    a = parse_args(what, argv[1:], f"{prog} {what.name}")
    columns = COLUMNS + tuple(getattr(what.module, "EXTRA_COLUMNS", ()))
    res = Results(a, argv[1:], columns, tuple(getattr(what.module, "POINT_COLUMNS", ())))
    a.command = res.command  # for a WHAT's own outputs (finish)
    print(f"# {res.command}\n# {res.head[1]}\n# results: {a.out}\n" + TABLE_HEAD, flush=True)
    from bench.paired import BenchError
    try:
        for rows in what.module.run(a, log=lambda s: print("# " + s, flush=True)):
            for r in rows:
                print(table_line(r), flush=True)
            res.add(rows)
    except BenchError as e:  # a process failed or hung: what was measured stays written
        res.finish(plots=False)
        print(f"{prog} {what.name}: error: {cli.one_line(e)}", file=sys.stderr)
        return 1
    files = res.finish(plots=not a.no_plots, finish=getattr(what.module, "finish", None))
    wrong = sum(int(r["wrong"]) for r in res.rows)
    print(f"# #wrong: {wrong}\n# wrote " + ", ".join(files))
    if wrong:
        print(f"{prog} {what.name}: {wrong} wrong results (the rows' wrong column)",
              file=sys.stderr)
        return 1
    return 0
