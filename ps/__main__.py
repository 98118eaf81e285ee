"""Run one parameter-server process: `python -m ps shard ...` or `python -m ps coordinator ...`.

Each prints `listening HOST:PORT` once it serves (port 0 picks a free one) and serves until
SIGTERM or SIGINT. The policy comes from a JSON file (`--policy`, PolicyConfig fields) or
the defaults. A shard starts at zero weights, or at `--init FILE` (a .npy of its range).
Logs: --log-level, --log-format text|kv|json (spina/log.py).
"""
from __future__ import annotations

import json
import signal
import threading

import numpy as np

from ps.config import PolicyConfig
from ps.server import Coordinator, ShardServer
from spina import cli, log as spina_log


def main(argv=None) -> None:
    ap = cli.ArgumentParser(prog="python -m ps", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    sh = sub.add_parser("shard", help="serve one parameter shard")
    sh.add_argument("--index", type=int, required=True)
    sh.add_argument("--lo", type=int, default=0, help="offset of the shard in the flat vector")
    sh.add_argument("--size", type=int, help="elements (zero weights); or --init")
    sh.add_argument("--init", help=".npy file with the shard's initial weights")
    co = sub.add_parser("coordinator", help="serve the policy coordinator")
    for p in (sh, co):
        p.add_argument("--nworkers", type=int, required=True)
        p.add_argument("--policy", help="JSON file of PolicyConfig fields")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=0)
        spina_log.add_options(p)
    args = ap.parse_args(argv)
    spina_log.setup(f"ps-{args.role}", args.log_level, args.log_format)
    policy = PolicyConfig.from_dict(json.load(open(args.policy))) if args.policy else PolicyConfig()
    if args.role == "shard":
        if (args.size is None) == (args.init is None):
            ap.error("shard: give exactly one of --size and --init")
        init = np.load(args.init) if args.init else np.zeros(args.size, np.float32)
        server = ShardServer(args.index, args.lo, init, args.nworkers, policy, args.host, args.port)
    else:
        server = Coordinator(args.nworkers, policy, args.host, args.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"listening {server.address}", flush=True)
    stop.wait()
    server.stop(1)


if __name__ == "__main__":
    main()
