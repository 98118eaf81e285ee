"""profile: cProfile of the host agent and the software switch, and the agent's memory per
call.

    python -m bench profile                       # 4 ranks, 25M elements, 1% and 100%
    python -m bench profile -g 2 -b 4M -e 4M -n 1 --memory-sizes 1e6      # while developing
    python -m bench profile --pyspy RAW           # only summarize a py-spy record

Same processes as the all_reduce WHAT (bench/paired.py): the switch and every rank in its own
process on 127.0.0.1, SpINA alone. Per size and density two clusters: a plain one (the row's
time, bytes, the switch's packet rate per CPU-second) and one under cProfile, which wraps
the switch's serve loop (timer: the thread's CPU time, so idle waits in recvfrom do not
count) and rank 0's allreduce calls (timer: the thread's CPU time too; timed calls only, not
the warm-up); the .prof files and text reports land in the results folder's d<density>/
(profile.json: the calls of the hot functions). cProfile adds a fixed cost per Python
function call, so per-call costs of small functions are inflated (`profiled_time_us` beside
`time_us` shows by how much). Memory: one extra call per rank under tracemalloc (numpy
reports its buffers to it), peak above the start of the call, for each size in
--memory-sizes (memory.json). Every result is checked as all_reduce's (`wrong`).
"""
from __future__ import annotations

import io
import json
import os
import pstats

from bench.all_reduce import nlanes_for, round_or_blank, run_spina
from bench.harness import method_rows
from bench.procs import Point

DESCRIPTION = "cProfile of the agent and the switch at a point, and the agent's memory per call"
METHODS = ("spina",)
DEFAULTS = dict(methods="spina", densities="0.01,1", begin="100000000", end="100000000",
                repeats=3)
EXTRA_COLUMNS = ("profiled_time_us", "switch_pkts_per_cpu_s", "switch_payload_gbit_per_cpu_s",
                 "agent_cpu_s", "packets_per_link", "resends", "reports")
HOT_SWITCH = ("process_into", "result_into", "sendto", "recvfrom_into", "header_error",
              "_process")
HOT_AGENT = ("allreduce", "answer_batch", "answer", "on_answer", "_next_round", "_queue",
             "recv_answers", "send_batch", "_flush", "scan_float_blocks", "fill_round",
             "deliver", "resend_due", "build", "select")


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--memory-sizes", default="1e6,5e6,25e6",
                    type=cli.parsed_by(_counts, "counts", bad=("x", "1e6,y")),
                    help="comma list of element counts whose memory per call is measured "
                    "('' for none; default %(default)s)")
    ap.add_argument("--top", type=cli.int_range(1, 1000), default=25,
                    help="functions per text report (default %(default)s)")
    ap.add_argument("--pyspy", metavar="RAW", type=cli.input_file,
                    help="only summarize a `py-spy record "
                    "--subprocesses -f raw` file into pyspy.txt (sampling rate: --pyspy-rate)")
    ap.add_argument("--pyspy-rate", type=cli.positive_float, default=250.0)


def check_options(a) -> str | None:
    if a.topo is not None or a.rates:
        return "argument -t/--topology: the profile runs on loopback"
    if len(a.workers) != 1:
        return "argument -g/--workers: one count"
    return None


def _counts(text: str) -> list[int]:
    """--memory-sizes: a comma list of element counts ('' for none)."""
    try:
        return [int(float(v)) for v in text.split(",") if v]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma list of numbers") from None


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


def run(a, log):
    if a.pyspy:
        with open(os.path.join(a.out, "pyspy.txt"), "w") as f:
            f.write(summarize_pyspy(a.pyspy, a.pyspy_rate) + "\n")
        log(f"wrote {a.out}/pyspy.txt")
        return
    n = a.workers[0]
    a.profile = {"profile": {}, "memory": []}
    for size in a.sizes:
        for d in a.densities:
            yield profile_point(a, Point("profile", n, size // 4, d, 256, nlanes_for(256, 56),
                                         256), log)
    for elements in a.memory_sizes:
        for d in a.densities:
            m = run_spina(Point("memory", n, elements, d, 256, nlanes_for(256, 56), 256), 1,
                          memory=True)["memory"]
            tensor = 4 * elements
            peak = max(w["peak_traced"] for w in m)
            rss = max(w["rss_growth"] for w in m)
            a.profile["memory"].append(dict(elements=elements, density=d, tensor_bytes=tensor,
                                            peak_traced=peak, peak_over_tensor=peak / tensor,
                                            rss_growth=rss, rss_over_tensor=rss / tensor))
            log(f"memory {elements:,} elements, density {d:g}: peak {peak / tensor:.2f}x "
                f"tensor, RSS growth {rss / tensor:.2f}x")


def profile_point(a, p: Point, log) -> list[dict]:
    """The plain and the profiled cluster of one point: its row; reports in d<density>/."""
    out = os.path.join(a.out, f"d{p.density:g}" + ("" if len(a.sizes) == 1 else
                                                   f"_{4 * p.elements}"))
    os.makedirs(out, exist_ok=True)
    load0 = os.getloadavg()[0]
    plain = run_spina(p, a.repeats)
    prof = run_spina(p, a.repeats, profile_dir=out)
    sw, agent = os.path.join(out, "switch.prof"), os.path.join(out, "agent0.prof")
    for name, path in (("switch", sw), ("agent0", agent)):
        with open(os.path.join(out, f"{name}.txt"), "w") as f:
            f.write(top(path, "tottime", a.top))
            f.write(top(path, "cumulative", a.top))
    a.profile["profile"][os.path.basename(out)] = dict(
        point=str(p), switch=plain["switch"], profiled_switch=prof["switch"],
        switch_calls={fn: ncalls(sw, fn) for fn in HOT_SWITCH},
        agent_calls={fn: ncalls(agent, fn) for fn in HOT_AGENT})
    log(f"density {p.density:g}: reports in {out}")
    point = dict(size=4 * p.elements, elements=p.elements, dtype="float32", density=p.density,
                 workers=p.workers, lane_bits=32, rate="")
    med = sorted(prof["times"])[len(prof["times"]) // 2]
    extras = {"spina": dict(profiled_time_us=round(med * 1e6, 1),
                            switch_pkts_per_cpu_s=round_or_blank(plain["switch_pkt_rate"]),
                            switch_payload_gbit_per_cpu_s=round_or_blank(plain["switch_gbit"],
                                                                         3),
                            agent_cpu_s=round(plain["cpu"], 4),
                            packets_per_link=round(plain["packets"]),
                            resends=plain["resends"], reports=os.path.relpath(out, a.out))}
    return method_rows(a.what, point, {"spina": plain["times"]}, bus="all_reduce",
                       sent={"spina": round(plain["bytes"])},
                       wrong={"spina": plain["wrong"] + prof["wrong"]},
                       load=f"{load0:.2f}-{os.getloadavg()[0]:.2f}", extras=extras)


def finish(rows, a) -> list[str]:
    """profile.json (the hot functions' calls per point) and memory.json."""
    out = []
    for part in ("profile", "memory"):
        if getattr(a, "profile", {}).get(part):
            out.append(os.path.join(a.out, f"{part}.json"))
            with open(out[-1], "w") as f:
                json.dump(a.profile[part], f, indent=1, default=str)
    return out


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
