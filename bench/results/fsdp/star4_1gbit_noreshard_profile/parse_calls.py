"""Per-step sums of the calls_rank*.log lines (profile_instrumentation.patch's): a step is
the forward's three all-gathers and the backward's reduce-scatters (G/S: SpINA's; g/s:
gloo's, timed the same way); `other` is the step's span less both. Run from this folder:
python parse_calls.py nslots16/calls_rank*.log"""
import re
import sys

for fn in sys.argv[1:]:
    calls = []
    for line in open(fn):
        d = dict(re.findall(r"(\w+)=([^ ]+)", line))
        calls.append((line[0], float(d["t0"]), float(d["dt"]), int(d["n"])))
    for gather, scatter in (("G", "S"), ("g", "s")):
        cs = [c for c in calls if c[0] in (gather, scatter)]
        steps, i = [], 0
        while i < len(cs):
            if cs[i][0] == gather and i + 3 < len(cs) and cs[i + 3][0] == scatter:
                j = i + 3
                while j < len(cs) and not (cs[j][0] == gather and cs[j][3] == cs[i][3]):
                    j += 1
                steps.append(cs[i:j])
                i = j
            else:
                i += 1
        tot = [0.0] * 4
        for c in steps:
            g = sum(x[2] for x in c if x[0] == gather)
            s = sum(x[2] for x in c if x[0] == scatter)
            span = c[-1][1] + c[-1][2] - c[0][1]
            tot = [a + b for a, b in zip(tot, (span, g, s, span - g - s))]
        n = len(steps)
        print(f"{fn} {'spina' if gather == 'G' else 'gloo'}: {n} steps, mean span "
              "%.3f gather %.3f scatter %.3f other %.3f s" % tuple(t / n for t in tot))
