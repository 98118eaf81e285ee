"""Run one parameter-server process: `python -m ps shard ...` or `python -m ps coordinator ...`.

Each prints `listening HOST:PORT` once it serves (port 0 picks a free one) and serves until
SIGTERM or SIGINT. The policy comes from a JSON file (`--policy`, PolicyConfig fields) or
the defaults. A shard starts at zero weights, or at `--init FILE` (a .npy of its range).
Logs: --log-level, --log-format text|kv|json (spina/log.py).
"""
from __future__ import annotations

import json
import signal
import sys
import threading

import numpy as np

from ps.config import PolicyConfig
from ps.server import Coordinator, ShardServer
from spina import cli, log as spina_log
from spina.net import check_tcp_free


def _policy(path: str) -> PolicyConfig:
    """An argparse type: a JSON file of PolicyConfig fields, read and checked."""
    cli.input_file(path)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {cli.one_line(e)}") from None
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    try:
        return PolicyConfig.from_dict(doc)
    except ValueError as e:  # ConfigError: names the field
        raise ValueError(f"{path}: {e}") from None


def parser(prog: str = "python -m ps"):
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    sh = sub.add_parser("shard", help="serve one parameter shard")
    sh.add_argument("--index", type=cli.int_range(0), required=True)
    sh.add_argument("--lo", type=cli.int_range(0), default=0,
                    help="offset of the shard in the flat vector")
    sh.add_argument("--size", type=cli.int_range(1), help="elements (zero weights); or --init")
    sh.add_argument("--init", type=cli.input_file,
                    help=".npy file with the shard's initial weights")
    co = sub.add_parser("coordinator", help="serve the policy coordinator")
    for p in (sh, co):
        p.add_argument("--nworkers", type=cli.int_range(1), required=True)
        p.add_argument("--policy", type=cli.parsed_by(_policy, "policy",
                                                      bad=("no-such-file.json", ".")),
                       help="JSON file of PolicyConfig fields (ps/config.py)")
        p.add_argument("--host", type=cli.ipv4_host, default="127.0.0.1")
        p.add_argument("--port", type=cli.int_range(0, 65535, " (0: any free)"), default=0)
        spina_log.add_options(p)
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    prog = f"{ap.prog} {args.role}"
    spina_log.setup(f"ps-{args.role}", args.log_level, args.log_format)
    policy = args.policy or PolicyConfig()
    if args.role == "shard":
        if (args.size is None) == (args.init is None):
            ap.error("shard: give exactly one of --size and --init")
        try:
            init = np.load(args.init) if args.init else np.zeros(args.size, np.float32)
        except (OSError, ValueError) as e:
            return cli.fail(prog, f"--init {args.init}: {cli.one_line(e)}")
    try:
        check_tcp_free(args.host, args.port, f"the {args.role}")
    except OSError as e:
        return cli.fail(prog, f"--host/--port: {e.strerror}")
    try:
        server = (ShardServer(args.index, args.lo, init, args.nworkers, policy, args.host,
                              args.port) if args.role == "shard"
                  else Coordinator(args.nworkers, policy, args.host, args.port))
        bound = server.port
    except RuntimeError:  # grpcio >= 1.5x raises where older ones returned port 0
        bound = 0
    if bound == 0:
        return cli.fail(prog, f"--host/--port: cannot listen on {args.host}:{args.port} "
                                 "(in use, or not this host's)")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"listening {server.address}", flush=True)
    stop.wait()
    server.stop(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
