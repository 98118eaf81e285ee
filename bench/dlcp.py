"""dlcp: DLCP under congestion: step time of one gradient all-reduce per step, exact vs bounded
loss, fixed vs layer priorities, and gloo, over the same congested queue (docs/dlcp.md).

    python -m bench dlcp                                      # the documented run (2.5 min)
    python -m bench dlcp -g 2 --model 64,64,10 -n 2 --out /tmp/d        # a smoke run
    python -m bench dlcp --train 400 -m exact/fixed,b10%/layer          # time to accuracy

The methods are the configurations (bench/dlcp_bench/configs.py: exact/fixed, ..., b10%/layer,
gloo, the /auto deadlines), interleaved step by step in the same processes, the order rotating
each repeat (-n repeats after a warm-up); the fabric, what a step does and what is checked:
bench/dlcp_bench/__init__.py. -g workers, --rates the worker links' rate (one), the size is
--model's gradient (-b/-e are not used: the model sets it). time = the median step (the
slowest rank's), vs_gloo paired per repeat with the gloo configuration's step; `wrong` counts
the steps whose SpINA results differ between ranks or whose exact mode's result is off the
exact sum. Besides the harness's columns: the configuration's bound and policies, p90 and p99,
blocks lost and off per call against the bound, partial rounds, loss-tolerant packets,
resends, the deadline, the leaf's congestion and tail drops. dlcp_steps.csv (every step),
dlcp_summary.md (issue 14's target, steps paired by repeat) and dlcp_congestion.png beside the
harness's outputs. `--train STEPS`: each configuration trains
the digits MLP through the same fabric instead; time = its training seconds, one repeat, with
the seconds and steps to --target-accuracy (dlcp_train_curves.csv, dlcp_train.png).
"""
from __future__ import annotations

import argparse
import os

from bench.dlcp_bench.cli import add_options as _dlcp_options
from bench.dlcp_bench.configs import COLUMNS, DEFAULT_CONFIGS, STEP_COLUMNS, TRAIN_COLUMNS
from bench.dlcp_bench.model import layer_sizes
from bench.harness import method_rows

DESCRIPTION = "DLCP step time under a congested uplink: exact vs bounded loss, priorities, gloo"
METHODS = DEFAULT_CONFIGS
DEFAULT_MODEL = (784, 512, 256, 10)
DEFAULTS = dict(methods=",".join(DEFAULT_CONFIGS), densities="1", repeats=50,
                begin=str(4 * sum(layer_sizes(list(DEFAULT_MODEL)))),
                end=str(4 * sum(layer_sizes(list(DEFAULT_MODEL)))), rates="1gbit")
_SAME = ("config", "method", "workers", "elements", "steps", "min_s", "max_s", "median_s",
         "load_min", "load_max", "verified")
EXTRA_COLUMNS = tuple(c for c in COLUMNS if c not in _SAME) + (
    "seconds_to_target", "steps_to_target", "final_accuracy", "congestion_drops")  # --train


def add_options(ap) -> None:
    _dlcp_options(ap)


def check_options(a) -> str | None:
    if a.topo is not None:
        return ("argument -t/--topology: dlcp's fabric is its own file, "
                "bench/topologies/dlcp_leaf16.yaml (give no -t)")
    if len(a.rates) != 1:
        return "argument --rates: dlcp takes one worker-link rate"
    if a.densities != [1.0]:
        return "argument -d/--densities: the gradient is dense (give -d 1)"
    if len(a.workers) != 1 or not 2 <= a.workers[0] <= 16:
        return "argument -g/--workers: one count, 2..16"
    if a.lane_bits != [32]:
        return "argument -l/--lane-bits: dlcp's jobs are 32-bit"
    if a.train and (a.train_model[0] != 64 or a.train_model[-1] != 10):
        return (f"argument --train-model: digits need 64 inputs and 10 outputs, got "
                f"{','.join(map(str, a.train_model))}")
    model = a.train_model if a.train else a.model
    a.sizes = [4 * sum(layer_sizes(model))]  # the model's gradient is the size
    from spina.netns import why_no_namespaces
    why = why_no_namespaces()
    return f"dlcp: {why} (its fabric is namespaces)" if why else None


def _dlcp_args(a) -> argparse.Namespace:
    """The options bench/dlcp_bench/run.py reads, from the harness's."""
    return argparse.Namespace(**vars(a) | dict(workers=a.workers[0], configs=list(a.methods),
                                               steps=a.repeats, rate=a.rates[0]))


def run(a, log):
    from bench.dlcp_bench.cli import uplink_text
    from bench.dlcp_bench.report import train_outputs
    from bench.dlcp_bench.run import run as run_dlcp
    d = _dlcp_args(a)
    model = a.train_model if a.train else a.model
    log(f"{d.workers} workers, model {','.join(map(str, model))}; uplink {uplink_text(d)}, "
        f"background {a.background:g} frames/s of {a.bg_size} B")
    out, rows_by, info = run_dlcp(d)
    a.dlcp = (out, rows_by, info)
    elements = sum(layer_sizes(model))
    point = dict(size=4 * elements, elements=elements, dtype="float32", density=1.0,
                 workers=d.workers, lane_bits=32, rate=d.rate)
    if a.train:
        curves, rows = train_outputs(out, d)
        a.dlcp = (curves, rows, info)
        times = {r["config"]: [r["seconds"]] for r in rows}
        wrong = {r["config"]: int(not r["weights_identical"]) for r in rows}
        extras = {r["config"]: {k: r[k] for k in ("seconds_to_target", "steps_to_target",
                                                  "final_accuracy", "congestion_drops")}
                  | dict(blocks_lost_per_call=r["blocks_lost"],
                         partial_rounds_per_step=r["partial_rounds"]) for r in rows}
        yield method_rows(a.what, point, times, bus="all_reduce", wrong=wrong,
                          load=f"{rows[0]['load_min']:.2f}-{rows[-1]['load_max']:.2f}",
                          extras=_clean(extras))
        return
    steps = out
    times = {c: [s["step_s"] for s in steps if s["config"] == c] for c in d.configs}
    wrong = {c: sum(s["wrong_step"] for s in steps if s["config"] == c) for c in d.configs}
    extras = {r["config"]: {k: r[k] for k in EXTRA_COLUMNS if k in r} for r in rows_by}
    loads = [s["load1"] for s in steps]
    yield method_rows(a.what, point, times, bus="all_reduce", wrong=wrong,
                      load=f"{min(loads):.2f}-{max(loads):.2f}", extras=_clean(extras))


def _clean(extras: dict) -> dict:
    """Floats to 6 significant digits, as the program before the harness wrote them."""
    return {m: {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in e.items()}
            for m, e in extras.items()}


def finish(rows, a) -> list[str]:
    """dlcp_steps.csv, dlcp_summary.md (issue 14's target, steps paired by repeat) and
    dlcp_congestion.png (--train: dlcp_train_curves.csv and dlcp_train.png)."""
    from bench.dlcp_bench.report import plot, train_plot, write_csv
    if not hasattr(a, "dlcp"):
        return []
    first, by, _ = a.dlcp
    if a.train:
        paths = [os.path.join(a.out, "dlcp_train_curves.csv")]
        write_csv(first, TRAIN_COLUMNS, paths[0])
        if not a.no_plots:
            paths.append(os.path.join(a.out, "dlcp_train.png"))
            train_plot(first, by, paths[-1])
        return paths
    from bench.dlcp_bench.cli import uplink_text
    from bench.dlcp_bench.report import summary
    paths = [os.path.join(a.out, "dlcp_steps.csv"), os.path.join(a.out, "dlcp_summary.md")]
    write_csv(first, STEP_COLUMNS + ("blocks_lost_max_call", "wrong_blocks_max_call",
                                     "allowed", "within_bound", "crcs"), paths[0])
    meta = dict(command=a.command, uplink=uplink_text(a),
                background=f"{a.background:g} UDP frames/s of {a.bg_size} B, open loop, "
                           f"priority 0 ({a.dlcp[2]['bg_sent']} sent)")
    with open(paths[1], "w") as f:  # issue 14's target and the per-repeat pairs
        f.write(summary(by, meta, first))
    if not a.no_plots:
        paths.append(os.path.join(a.out, "dlcp_congestion.png"))
        plot(first, by, paths[-1])
    return paths
