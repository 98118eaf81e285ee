"""Summarise bf-p4c's resource logs of the TNA program as Markdown (make tofino).

Usage: python3 scripts/tna_resources.py OUT_DIR [COMPILER_VERSION_LINE [LANE_BITS]]
         > tofino/build/resources.md   (resources16.md, resources8.md: -DSPINA_LANE_BITS=16, 8)

OUT_DIR is bf-p4c's -o directory; its pipe/logs/resources.json (per MAU stage: RAMs, TCAMs,
stateful (meter) ALUs, statistics ALUs, gateways, and the tables using them) and
pipe/logs/metrics.json (PHV containers) are read, and tofino/size.p4 for the elements a packet
carries (LANE_BITS: the lane-width profile compiled, default 32). Standard library only.
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

SIZE_P4 = pathlib.Path(__file__).resolve().parents[1] / "tofino" / "size.p4"


def _sizes() -> dict:
    """tofino/size.p4's numeric #defines."""
    return {k: int(v) for k, v in re.findall(r"#define (\w+) (\d+)\s", SIZE_P4.read_text())}


def _usages(units) -> list:
    """The non-empty usage lists of a unit array (RAMs, ALUs, gateways ...)."""
    return [u for u in units or () if u.get("usages")]


def _names(units) -> set:
    out = set()
    for u in _usages(units):
        for use in u["usages"]:
            name = use.get("used_by") or use.get("used_by_table") or use.get("name")
            if name:
                out.add(str(name))
    return out


def summarise(out_dir: pathlib.Path, version: str, lane_bits: int = 32) -> str:
    logs = out_dir / "pipe" / "logs"
    res = json.loads((logs / "resources.json").read_text())["resources"]
    stages = res["mau"]["mau_stages"]
    profile = "" if lane_bits == 32 else f" -DSPINA_LANE_BITS={lane_bits}"
    # The program and target bf-p4c names in its manifest (Tofino 1's default program without).
    program, target, arch = "spina_tna.p4", "tofino", "tna"
    manifest = out_dir / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        program, target = m["programs"][0]["program_name"], m["target"]
        arch = m.get("target_data", {}).get("architecture", arch)
    chip = {"tofino": "Tofino 1", "tofino2": "Tofino 2"}.get(target, target)
    lines = [f"# tofino/build: bf-p4c resource summary of tofino/{program}{profile}", "",
             (f"Compiler: `{version.strip()}`" if version.strip()
              else "Compiler: (version not given)"),
             f"Target: {chip} (`--target {target} --arch {arch}`), {res['mau']['nStages']} MAU "
             "stages per pipe (shared by ingress and egress).", "",
             "| stage | SRAMs | TCAMs | map RAMs | stateful ALUs | stats ALUs | gateways "
             "| stateful ALUs used by |",
             "|---|---|---|---|---|---|---|---|"]
    totals = [0] * 6
    used_stages = 0
    for st in sorted(stages, key=lambda s: s["stage_number"]):
        counts = [len(_usages(st.get("rams", {}).get("srams"))),
                  len(_usages(st.get("tcams", {}).get("tcams"))),
                  len(_usages(st.get("map_rams", {}).get("maprams"))),
                  len(_usages(st.get("meter_alus", {}).get("meters"))),
                  len(_usages(st.get("statistic_alus", {}).get("stats"))),
                  len(_usages(st.get("gateways", {}).get("gateways")))]
        if any(counts):
            used_stages += 1
        totals = [a + b for a, b in zip(totals, counts)]
        salu = ", ".join(sorted(_names(st.get("meter_alus", {}).get("meters"))))
        lines.append(f"| {st['stage_number']} | " + " | ".join(map(str, counts)) + f" | {salu} |")
    lines.append("| total | " + " | ".join(map(str, totals)) + " | |")
    lines += ["", f"Stages with any resource in use: {used_stages} of {res['mau']['nStages']}; "
              f"stateful ALUs: {totals[3]} of {4 * res['mau']['nStages']}."]
    s = _sizes()
    if "BLOCK_SIZE" in s:
        lane = f"int{lane_bits}"
        lines += ["", f"{lane} per packet: {s['NLANES'] * s['BLOCK_SIZE']} ({s['NLANES']} lane x "
                  f"{s['BLOCK_SIZE']}, {s['NLANES'] * s['BLOCK_SIZE'] * lane_bits // 8} bytes), in "
                  f"pair registers slot_values_l0_p<P> (two {lane} per stateful ALU"
                  + ("" if lane_bits == 32 else ", saturating add") + "): "
                  f"{s.get('EGRESS_PAIRS', 0)} in egress, "
                  f"{s.get('INGRESS_PAIRS', 0)} in ingress (tofino/size.p4)."]
    metrics = logs / "metrics.json"
    if metrics.exists():
        phv = json.loads(metrics.read_text()).get("phv", {})
        rows = [f"- {kind}: " + ", ".join(f"{u.get('bit_width', '?')}-bit: "
                                          f"{u.get('containers_occupied', '?')}" for u in usage)
                for kind, usage in phv.items() if isinstance(usage, list) and usage]
        if rows:
            lines += ["", "PHV containers occupied (metrics.json):"] + rows
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: tna_resources.py OUT_DIR [COMPILER_VERSION_LINE [LANE_BITS]]",
              file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[1])
    if not (out_dir / "pipe" / "logs" / "resources.json").exists():
        print(f"tna_resources.py: no pipe/logs/resources.json under {out_dir}", file=sys.stderr)
        return 2
    lane_bits = int(argv[3]) if len(argv) > 3 else 32
    if lane_bits not in (32, 16, 8):
        print(f"tna_resources.py: LANE_BITS {argv[3]!r}: must be 32, 16 or 8", file=sys.stderr)
        return 2
    sys.stdout.write(summarise(out_dir, argv[2] if len(argv) > 2 else "", lane_bits))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
