"""Issue 47's targets from one command: the harness runs that measure them, one after the
other into one folder, then every target with its measured value, met or not.

    python -m bench.targets                       # root; make bench-targets (12-15 min here)
    python -m bench.targets --smoke --out /tmp/t  # every run at a tiny size (tests/test_bench.py)

Each run (`RUNS`) is a harness command (`python -m bench WHAT ...`: the WHATs' own options,
nothing new) written into its own subfolder of the run folder (default
bench/results/targets/issue47/<run>/, each with its results.csv, summary.md and command.txt:
the command, commit and load at its start and end). The targets (`TARGETS`) are read from
those results.csv files into targets.md (a markdown table, docs/benchmark.md's) and printed;
command.txt of the run folder holds this command, the commit, the date and the load at start
and end. --smoke appends each run's `smoke` options to its command (argparse: the last one
wins): a 2-host star (topologies/star2.yaml), tiny sizes, a few steps; its values mean
nothing, it checks the plumbing.

A target not met is reported as not met (speed is never asserted); the exit status is 1 only
when a run failed or counted wrong results.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from bench import harness
from spina import cli

STAR4 = "bench/topologies/star4.yaml"
STAR8 = "bench/topologies/star8.yaml"
SMOKE_STAR = "-t bench/topologies/star2.yaml -g 2"
TRAIN_SMOKE = f"{SMOKE_STAR} -b 280K -e 280K --max-steps 3 --min-steps 3"


@dataclass(frozen=True)
class Run:
    """One harness command of the targets run: its subfolder `name`, the WHAT and its options;
    `smoke` the options --smoke appends."""
    name: str
    what: str
    args: str
    smoke: str

    def argv(self, smoke: bool) -> list[str]:
        return [self.what, *shlex.split(self.args), *(shlex.split(self.smoke) if smoke else [])]


RUNS = (
    Run("loopback_16k", "all_reduce", "-b 16K -e 16K -d 1 -g 4 -n 30 -m spina,gloo_allreduce",
        "-g 2 -n 3"),
    Run("sparse_1pct", "all_reduce", f"-t {STAR4} --rates 10gbit -b 32000000 -e 32000000 "
        "-d 0.01 -g 4 -n 9 -m spina,gloo_allreduce", f"{SMOKE_STAR} -b 1M -e 1M -n 2"),
    Run("sparse_1pct_8w", "all_reduce", f"-t {STAR8} --rates 10gbit -b 32000000 -e 32000000 "
        "-d 0.01 -g 8 -n 9 -m spina,gloo_allreduce", f"{SMOKE_STAR} -b 1M -e 1M -n 2"),
    # bench-train's gradient (6,316,042 float32) through the floor: its ratio to gloo bounds
    # the 10 Gbit/s dense target
    Run("floor_25mb", "all_reduce", f"-t {STAR4} --rates 1gbit,10gbit -b 25264168 "
        "-e 25264168 -d 1 -g 4 -n 5 -m spina,floor,gloo_allreduce",
        f"{SMOKE_STAR} -b 1M -e 1M -n 2"),
    Run("train", "training", f"-t {STAR4} --rates 1gbit,10gbit", TRAIN_SMOKE),  # bench-train's
    # PowerSGD left out of the 8 workers for time (its peers: the 4 workers' run)
    Run("train_8w", "training", f"-t {STAR8} -g 8 --rates 1gbit,10gbit "
        "-m gloo,spina,spina16,spina8,topk,fp16,bf16,compute --max-steps 60", TRAIN_SMOKE),
)
DENSE = ("spina", "spina16", "spina8")       # bench-train's SpINA dense methods
SPINA_BEST = DENSE + ("topk",)               # SpINA's methods for time to accuracy
HOOKS = ("powersgd1", "powersgd4", "fp16", "bf16")  # PyTorch's own


# ----------------------------------------------------------------------------- reading
class Rows:
    """A run folder's results.csv files, by run name."""

    def __init__(self, out: str):
        self.out, self.by_run = out, {}
        for r in RUNS:
            path = os.path.join(out, r.name, "results.csv")
            if os.path.exists(path):
                with open(path, newline="") as f:
                    self.by_run[r.name] = list(csv.DictReader(f))

    def get(self, run: str, method: str, rate: str | None = None) -> dict | None:
        return next((r for r in self.by_run.get(run, ()) if r["method"] == method
                     and (rate is None or r["rate"] == rate)), None)


def _f(row: dict | None, col: str) -> float | None:
    """A number of a row, or None (no row, or nothing measured)."""
    if row is None or row.get(col, "") in ("", None):
        return None
    return float(row[col])


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


@dataclass
class Outcome:
    measured: str
    met: bool | None  # None: reported only, or not measured

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**not met**", None: "reported"}[self.met]


def _unmeasured(run: str) -> Outcome:
    return Outcome(f"not measured (run {run} has no rows)", False)


def dense_step(rows: Rows, rate: str, bound: float, run: str = "train") -> Outcome:
    """The best dense SpINA method's step over gloo's (paired), against `bound`."""
    got = {m: _f(rows.get(run, m, rate), "vs_gloo") for m in DENSE}
    got = {m: v for m, v in got.items() if v is not None}
    if not got:
        return _unmeasured(run)
    best = min(got, key=got.get)
    text = ", ".join(f"{m} {_x(v)}" for m, v in got.items()) + f"; best {best}"
    return Outcome(text, got[best] <= bound)


def topk_to_target(rows: Rows, rate: str, bound: float, run: str = "train") -> Outcome:
    r = rows.get(run, "topk", rate)
    if r is None:
        return _unmeasured(run)
    ratio = _f(r, "time_ratio")
    if ratio is None:
        return Outcome(f"never reached {r['target_acc']}% in {r['steps']} steps "
                       f"(step {_x(_f(r, 'vs_gloo'))})", False)
    gloo = rows.get(run, "gloo", rate) or {}
    return Outcome(f"{_x(ratio)} ({r['steps_to_target']} steps against gloo's "
                   f"{gloo.get('steps_to_target') or '-'}; step "
                   f"{_x(_f(r, 'vs_gloo'))})", ratio <= bound)


def best_against_hooks(rows: Rows, rate: str, run: str = "train") -> Outcome:
    """SpINA's best time to the accuracy target against the best of PyTorch's hooks."""
    def best(methods):
        got = {m: _f(rows.get(run, m, rate), "time_to_target_s") for m in methods}
        got = {m: v for m, v in got.items() if v is not None}
        return (min(got, key=got.get), min(got.values())) if got else (None, math.inf)
    if run not in rows.by_run:
        return _unmeasured(run)
    (s, ts), (h, th) = best(SPINA_BEST), best(HOOKS)
    say = lambda m, t: f"{m} {t:.2f} s" if m else "none reached the target"  # noqa: E731
    return Outcome(f"SpINA's best {say(s, ts)}; PyTorch's best {say(h, th)}",
                   s is not None and ts < th)


def dense_step_10g(rows: Rows) -> Outcome:
    """<= 1.0x gloo; where the floor's all-reduce of the same bytes is above 1.0x gloo's, the
    target is the floor: SpINA's all-reduce of those bytes no slower than the floor's."""
    floor = _f(rows.get("floor_25mb", "floor", "10gbit"), "vs_gloo")
    spina = _f(rows.get("floor_25mb", "spina", "10gbit"), "vs_floor")
    out = dense_step(rows, "10gbit", 1.0)
    out.measured += (f"; the floor's all-reduce of the same 25 MB {_x(floor)} gloo's, "
                     f"SpINA's {_x(spina)} the floor's")
    if not out.met and floor is not None and floor > 1.0:
        out.met = spina is not None and spina <= 1.0
    return out


def eight_workers(rows: Rows) -> Outcome:
    run = "train_8w"
    if run not in rows.by_run:
        return Outcome(f"not measured (run {run} has no rows)", None)
    parts = []
    for rate in ("1gbit", "10gbit"):
        dense = ", ".join(f"{m} {_x(_f(rows.get(run, m, rate), 'vs_gloo'))}" for m in DENSE)
        topk = _x(_f(rows.get(run, "topk", rate), "time_ratio"))
        parts.append(f"{rate}: dense step {dense}; top-k to target {topk}; "
                     + best_against_hooks(rows, rate, run).measured)
    return Outcome(". ".join(parts), None)


def sparse_call(rows: Rows, run: str) -> tuple[Outcome, float | None]:
    """A 1% call against 2 x (link time + one scan), the link time from the link counters
    (the busier direction at the point's rate), the scan the agents' own (scan_ms)."""
    r = rows.get(run, "spina")
    if r is None:
        return _unmeasured(run), None
    from spina.topology import parse_rate
    link = max(_f(r, "bytes_per_link"), _f(r, "rx_bytes_per_link") or 0.0) * 8 \
        / parse_rate(r["rate"])
    scan = _f(r, "scan_ms") / 1e3
    bound = 2 * (link + scan)
    t = _f(r, "time_us") / 1e6
    return Outcome(f"{1e3 * t:.1f} ms median [{float(r['time_min_us']) / 1e3:.1f}-"
                   f"{float(r['time_max_us']) / 1e3:.1f}], {_x(_f(r, 'vs_gloo'))} gloo; "
                   f"2 x ({1e3 * link:.2f} ms of link + {1e3 * scan:.2f} ms scan) = "
                   f"{1e3 * bound:.2f} ms; setup {r['setup_ms']} ms, data {r['data_ms']} ms, "
                   f"asleep {r['waited_ms']} ms, agent CPU {r['call_cpu_ms']} ms", t <= bound), \
        t


def small_call(rows: Rows) -> Outcome:
    r = rows.get("loopback_16k", "spina")
    g = rows.get("loopback_16k", "gloo_allreduce")
    if r is None or g is None:
        return _unmeasured("loopback_16k")
    v = _f(r, "vs_gloo")
    return Outcome(f"{_x(v)} ({float(r['time_us']) / 1e3:.2f} ms against "
                   f"{float(g['time_us']) / 1e3:.2f} ms)", v <= 1.0)


def planner(rows: Rows) -> Outcome:
    """The planner's calibrated model (collectives/ina_calibration.py: fitted to the
    committed runs) at this run's SpINA all-reduce points."""
    from collectives import ina_calibration as cal
    a = cal.fit(cal.load())
    topo = {r.name: r.args.split()[1] if r.args.startswith("-t ") else None for r in RUNS
            if r.what == "all_reduce"}
    errs = []
    for run, path in topo.items():
        for r in rows.by_run.get(run, ()):
            if r["method"] != "spina":
                continue
            net = cal._network(os.path.basename(path) if path else None, r["rate"])
            p = cal.Point(run, "all_reduce", int(r["workers"]), int(r["size"]),
                          density=float(r["density"]), lane_bits=int(r["lane_bits"]),
                          block=int(r["block_size"]), agent_cpu_s=None, switch_cpu_s=None,
                          nlanes=int(r["nlanes"]), nslots=int(r["nslots"]),
                          **cal._timed(r), **net)
            e = cal.predict(a, p).seconds / p.measured_s - 1
            errs.append(f"{run} {r['rate'] or 'loopback'} {e:+.0%}")
            if abs(e) > cal.TARGET:
                errs[-1] = f"**{errs[-1]}**"
    if not errs:
        return Outcome("no SpINA all-reduce point measured", False)
    miss = sum(s.startswith("**") for s in errs)
    return Outcome(f"{len(errs) - miss} of {len(errs)} within 20%: " + ", ".join(errs),
                   miss == 0)


@dataclass(frozen=True)
class Target:
    text: str
    check: object  # Rows -> Outcome


TARGETS = (
    Target("bench-train 1 Gbit/s: dense step <= 0.75x gloo",
           lambda rows: dense_step(rows, "1gbit", 0.75)),
    Target("bench-train 1 Gbit/s: top-k time to the target <= 0.3x gloo's",
           lambda rows: topk_to_target(rows, "1gbit", 0.3)),
    Target("bench-train 1 Gbit/s: SpINA's best reaches the target sooner than PyTorch's "
           "best hook", lambda rows: best_against_hooks(rows, "1gbit")),
    Target("bench-train 10 Gbit/s: dense step <= 1.0x gloo, or the floor's ratio where the "
           "floor is above 1.0x", dense_step_10g),
    Target("bench-train 10 Gbit/s: top-k time to the target <= 0.8x gloo's",
           lambda rows: topk_to_target(rows, "10gbit", 0.8)),
    Target("bench-train 10 Gbit/s: SpINA's best reaches the target sooner than PyTorch's "
           "best hook", lambda rows: best_against_hooks(rows, "10gbit")),
    Target("bench-train, 8 workers beside", eight_workers),
    Target("1% of 32 MB at 10 Gbit/s, 4 workers: <= 2 x (link time + one scan)",
           lambda rows: sparse_call(rows, "sparse_1pct")[0]),
    Target("1% of 32 MB at 10 Gbit/s, 8 workers beside",
           lambda rows: Outcome(sparse_call(rows, "sparse_1pct_8w")[0].measured, None)),
    Target("16 KiB dense all-reduce, 4 workers on loopback: <= 1.0x gloo's latency",
           small_call),
    Target("the planner: within 20% of every SpINA point measured here (this run's)",
           planner),
)


# ----------------------------------------------------------------------------- output
def table(rows: Rows) -> str:
    out = ["| target | measured | |", "|---|---|---|"]
    for t in TARGETS:
        o = t.check(rows)
        out.append(f"| {t.text} | {o.measured} | {o.verdict} |")
    return "\n".join(out)


def runs_list(out: str) -> list[str]:
    """Each run's command and load, from its command.txt."""
    lines = []
    for r in RUNS:
        path = os.path.join(out, r.name, "command.txt")
        if not os.path.exists(path):
            lines.append(f"- `{r.name}`: not run")
            continue
        with open(path) as f:
            info = dict(ln.split(": ", 1) for ln in f.read().splitlines() if ": " in ln)
        load = [info.get(k, "?").split()[0] for k in ("load at start", "load at end")]
        lines.append(f"- [`{r.name}`]({r.name}/summary.md): `{info.get('command', '?')}`, "
                     f"{info.get('date', '?')}, {info.get('seconds', '?')} s, load "
                     f"{load[0]}-{load[1]}")
    return lines


def parser(prog: str = "python -m bench.targets") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description="issue 47's targets: the harness runs "
                            "that measure them into one folder, then each target met or not")
    ap.add_argument("--name", type=harness._name, default="targets/issue47",
                    help="results folder bench/results/NAME (default %(default)s)")
    ap.add_argument("--out", default=None, type=cli.output_dir,
                    help="results folder (default bench/results/NAME)")
    ap.add_argument("--smoke", action="store_true",
                    help="every run at a tiny size on a 2-host star (checks the plumbing)")
    return ap


def main(argv=None, prog: str = "python -m bench.targets") -> int:
    a = parser(prog).parse_args(argv)
    out = a.out or os.path.join(harness.RESULTS, a.name)
    os.makedirs(out, exist_ok=True)
    command = shlex.join(["python", "-m", "bench.targets", *(sys.argv[1:] if argv is None
                                                             else argv)])
    t0, load0 = time.time(), os.getloadavg()
    head = harness.run_head(command) + [harness.load_line("start", load0)]
    failed = []
    for r in RUNS:
        argv_r = r.argv(a.smoke) + ["--out", os.path.join(out, r.name)]
        print(f"## {r.name}: python -m bench {shlex.join(argv_r)}", flush=True)
        done = subprocess.run([sys.executable, "-m", "bench", *argv_r], cwd=harness.ROOT)
        if done.returncode:
            failed.append(f"{r.name} (exit {done.returncode})")
    head += [harness.load_line("end"),
             f"seconds: {time.time() - t0:.0f}"]
    with open(os.path.join(out, "command.txt"), "w") as f:
        f.write("\n".join(head) + "\n")
    rows = Rows(out)
    page = "\n".join(["# Issue 47's targets", ""] + [f"- {h}" for h in head]
                     + ([f"- failed: {', '.join(failed)}"] if failed else [])
                     + ["", table(rows), "", "Runs (each folder: results.csv, summary.md, "
                        "command.txt):", ""] + runs_list(out)) + "\n"
    with open(os.path.join(out, "targets.md"), "w") as f:
        f.write(page)
    print(page + f"# wrote {os.path.join(out, 'targets.md')}", flush=True)
    if failed:
        print(f"{prog}: error: runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
