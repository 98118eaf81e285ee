"""One rank of a job deployed by the controller: all-reduce a tensor of VALUE everywhere and
print what came back. The README's multi-process path runs one per rank:

    .venv/bin/python examples/one_rank.py build/agents/job1-rank0.json --value 1

The agent comes from the assignment file the controller wrote (host_agent.assignment.connect);
its first call joins the run at the file's rendezvous, where `controller serve` gives the run
its own epoch.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from host_agent.agent import SpinaError
from host_agent.assignment import connect
from spina import cli
from spina.config import ConfigError


def parser(prog: str = "examples/one_rank.py"):
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("assignment", type=cli.input_file,
                    help="the rank's file, agents_dir/job<ID>-rank<R>.json")
    ap.add_argument("--value", type=cli.finite, default=1.0, help="every element's value")
    ap.add_argument("--elements", type=cli.int_range(1, 1 << 28), default=1 << 20,
                    help="tensor length (default %(default)s)")
    ap.add_argument("--timeout", type=cli.positive_float, default=30.0,
                    help="seconds to wait for the other ranks (default %(default)s)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        agent = connect(args.assignment, timeout=args.timeout)
    except (ConfigError, OSError) as e:  # OSError: the rank's address is taken
        return cli.fail(ap.prog, e)
    try:
        got = agent.allreduce(np.full(args.elements, args.value, np.float32))
    except SpinaError as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 1
    finally:
        agent.close()
    lo, hi = float(got.min()), float(got.max())
    print(f"rank {agent.rank}: sum {lo:g}" if lo == hi else f"rank {agent.rank}: {lo:g}..{hi:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
