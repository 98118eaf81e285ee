"""Start a SpINA mininet testbed and run one all-reduce on every host (or open the CLI).

    python -m testbed single --hosts 4
    python -m testbed leafspine --leaves 2 --spines 2 --hosts-per-leaf 2 --cli
    python -m testbed single --switch bmv2        # needs `make p4` and simple_switch_grpc

Needs root. Every process and link it starts is removed on exit.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from testbed import topos

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_allreduce(tb: topos.Testbed, jd: dict, seed: int = 1, n: int = 20000) -> list[dict]:
    """Every host runs tests/netns_worker.py; returns their JSON reports."""
    procs = [h.popen([sys.executable, str(ROOT / "tests" / "netns_worker.py"), json.dumps(jd),
                      str(i), topos.SWITCH_IP, "47000", str(seed), str(n)], cwd=str(ROOT))
             for i, h in enumerate(tb.hosts)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"worker failed: {stderr.decode()[-2000:]}")
            out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n\n")[0])
    p.add_argument("topology", choices=["single", "leafspine"])
    p.add_argument("--switch", choices=["soft", "bmv2"], default="soft",
                   help="switch nodes: the software switch in L2 mode (default) or BMv2")
    p.add_argument("--hosts", type=int, default=3, help="single: number of hosts")
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--spines", type=int, default=2)
    p.add_argument("--hosts-per-leaf", type=int, default=2)
    p.add_argument("--cli", action="store_true", help="open the mininet CLI instead")
    a = p.parse_args(argv)
    if a.topology == "single":
        tb = topos.single(a.hosts, switch=a.switch)
    else:
        tb = topos.leafspine(a.leaves, a.spines, a.hosts_per_leaf, switch=a.switch)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        if a.cli:
            from mininet.cli import CLI
            CLI(tb.net)
        else:
            for r in run_allreduce(tb, jd):
                print(json.dumps(r))
    finally:
        tb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
