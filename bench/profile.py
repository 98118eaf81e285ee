"""Profile the host agent and the software switch, and measure the agent's memory per call.

    python -m bench.profile                    # base point (4 workers, 25M), 1% and 100%
    python -m bench.profile --elements 1e6 --workers 2 --repeats 1 --memory-sizes 1e6
                                               # a quick run while developing

Same processes as the benchmark (bench/procs.py): the switch and every worker in its own
process on 127.0.0.1. cProfile wraps the switch's serve loop (timer: the thread's CPU time, so
idle waits in recvfrom do not count) and rank 0's allreduce calls (timer: the thread's CPU
time too; timed calls only, not the warm-up); the .prof files and text reports land in
--out/<density>/. cProfile adds a fixed cost per Python function call, so per-call costs
of small functions are inflated; the switch's packet rates are also reported from a run
without the profiler. Memory: one extra call per worker under tracemalloc (numpy reports
its buffers to it), peak above the start of the call, for each size in --memory-sizes.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import sys
from dataclasses import replace

from bench.all_reduce import nlanes_for, run_spina
from bench.procs import Point


def top(path: str, sort: str, n: int) -> str:
    s = io.StringIO()
    st = pstats.Stats(path, stream=s)
    st.strip_dirs().sort_stats(sort).print_stats(n)
    return s.getvalue()


def ncalls(path: str, name: str) -> tuple[int, float, float]:
    """(calls, total own seconds, cumulative seconds) of functions named `name`, Python or
    built in (cProfile names those "<method 'sendto' of ...>", "<built-in method m.name>")."""
    st = pstats.Stats(path)
    calls = tt = ct = 0
    for (_, _, fn), (_cc, nc, t, c, _) in st.stats.items():
        if fn == name or (fn.startswith("<") and (f"'{name}'" in fn or fn.endswith(f".{name}>"))):
            calls, tt, ct = calls + nc, tt + t, ct + c
    return calls, tt, ct


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--elements", type=lambda s: int(float(s)), default=25_000_000)
    ap.add_argument("--densities", default="0.01,1.0")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-sizes", default="1e6,5e6,25e6")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default="bench/out/profile")
    ap.add_argument("--skip-profile", action="store_true", help="memory measurement only")
    ap.add_argument("--pyspy", metavar="RAW", help="only summarize a `py-spy record "
                    "--subprocesses -f raw` file (sampling rate: --pyspy-rate)")
    ap.add_argument("--pyspy-rate", type=float, default=250.0)
    a = ap.parse_args(argv)
    if a.pyspy:
        print(summarize_pyspy(a.pyspy, a.pyspy_rate))
        return 0
    base = Point("profile", a.workers, a.elements, 0.01, 256, nlanes_for(256, 56), 256)
    summary = {"profile": {}, "memory": []}
    for d in ([] if a.skip_profile else (float(v) for v in a.densities.split(","))):
        p = replace(base, density=d)
        out = os.path.join(a.out, f"d{d:g}")
        os.makedirs(out, exist_ok=True)
        plain = run_spina(p, a.repeats)
        prof = run_spina(p, a.repeats, profile_dir=out)
        sw, agent = os.path.join(out, "switch.prof"), os.path.join(out, "agent0.prof")
        for name, path in (("switch", sw), ("agent0", agent)):
            with open(os.path.join(out, f"{name}.txt"), "w") as f:
                f.write(top(path, "tottime", a.top))
                f.write(top(path, "cumulative", a.top))
        calls = {fn: ncalls(sw, fn) for fn in ("process_into", "result_into", "sendto",
                                               "recvfrom_into", "header_error", "_process")}
        acalls = {fn: ncalls(agent, fn) for fn in ("allreduce", "answer_batch", "answer",
                                                   "on_answer", "_next_round", "_queue",
                                                   "recv_answers",
                                                   "send_batch", "_flush", "scan_float_blocks",
                                                   "fill_round", "deliver", "resend_due",
                                                   "build", "select")}
        summary["profile"][f"{d:g}"] = dict(
            point=str(p),
            plain=dict(median_s=sorted(plain["times"])[len(plain["times"]) // 2],
                       times=plain["times"], switch=plain["switch"],
                       switch_pkts_per_cpu_s=plain["switch_pkt_rate"],
                       switch_payload_gbit_per_cpu_s=plain["switch_gbit"],
                       agent_cpu_s=plain["cpu"], packets_per_worker=plain["packets"],
                       bytes_per_worker=plain["bytes"], resends=plain["resends"]),
            profiled=dict(times=prof["times"], switch=prof["switch"]),
            switch_calls=calls, agent_calls=acalls)
        print(f"density {d:g}: plain {plain['times']}, profiled {prof['times']}; reports in {out}")
    for n in (int(float(v)) for v in a.memory_sizes.split(",") if v):
        for d in (float(v) for v in a.densities.split(",")):
            p = replace(base, elements=n, density=d)
            m = run_spina(p, 1, memory=True)["memory"]
            tensor = 4 * n
            peak = max(w["peak_traced"] for w in m)
            rss = max(w["rss_growth"] for w in m)
            summary["memory"].append(dict(elements=n, density=d, tensor_bytes=tensor,
                                          peak_traced=peak, peak_over_tensor=peak / tensor,
                                          rss_growth=rss, rss_over_tensor=rss / tensor))
            print(f"memory {n:,} elements, density {d:g}: peak {peak / tensor:.2f}x tensor, "
                  f"RSS growth {rss / tensor:.2f}x")
    os.makedirs(a.out, exist_ok=True)
    for part in ("profile", "memory"):
        if summary[part]:
            with open(os.path.join(a.out, f"{part}.json"), "w") as f:
                json.dump(summary[part], f, indent=1, default=str)
            print(f"wrote {a.out}/{part}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------- py-spy
def summarize_pyspy(path: str, rate: float, n: int = 12) -> str:
    """Where the active samples of a `py-spy record --subprocesses -f raw` file went.

    Samples are split by role (switch: under serve_forever; agent: under _allreduce_flat),
    then by leaf frame (own time) and by the role's direct callee (inclusive time).
    """
    from collections import Counter
    roles = {"switch": "serve_forever", "agent": "_allreduce_flat"}
    own = {r: Counter() for r in roles}
    incl = {r: Counter() for r in roles}
    total = Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = [fr for fr in stack.split(";") if not fr.startswith("process ")]
            for role, root in roles.items():
                at = next((i for i, fr in enumerate(frames) if fr.startswith(root + " ")
                           or f".{root} " in fr), None)
                if at is None:
                    continue
                c = int(count)
                total[role] += c
                own[role][_short(frames[-1])] += c
                incl[role][_short(frames[at + 1]) if at + 1 < len(frames) else "(self)"] += c
                break
    out = []
    for role in roles:
        t = total[role] or 1
        out.append(f"{role}: {total[role]} active samples = {total[role] / rate:.2f} CPU s "
                   f"(all processes of that role)")
        out.append("  inclusive, by direct callee of the loop:")
        out += [f"    {100 * c / t:5.1f}%  {k}" for k, c in incl[role].most_common(n)]
        out.append("  own time, by leaf frame:")
        out += [f"    {100 * c / t:5.1f}%  {k}" for k, c in own[role].most_common(n)]
    return "\n".join(out)


def _short(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (file.py:123)'."""
    name, _, loc = frame.partition(" (")
    return f"{name} ({os.path.basename(loc.rstrip(')'))})" if loc else name
