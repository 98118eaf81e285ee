"""Run the software switch as a long-lived process.

    python -m softswitch udp --job job.yaml            # UDP aggregator on 127.0.0.1:47000
    python -m softswitch l2 -i 1@veth1 -i 2@veth2 --config switch.yaml

`python -m softswitch <mode> --help` explains each mode's options.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from softswitch.pipeline import DEFAULT_POOL_SLOTS, DEFAULT_SLOT_CAPACITY
from spina import wire


def _load(path: str):
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml
        return yaml.safe_load(text)
    return json.loads(text)


def _interface(text: str) -> tuple[int, str]:
    port, sep, name = text.partition("@")
    if not sep or not port.isdigit() or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT@INTERFACE, e.g. 1@veth1")
    return int(port), name


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m softswitch",
        description="SpINA software switch: the P4 program's aggregation pipeline in Python.")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument("--pool-slots", type=int, default=DEFAULT_POOL_SLOTS,
                   help=f"aggregation slots in the pool (default {DEFAULT_POOL_SLOTS})")
    p.add_argument("--slot-capacity", type=int, default=DEFAULT_SLOT_CAPACITY,
                   help="int32 elements per slot copy, at least nlanes*block_size of every job "
                        f"(default {DEFAULT_SLOT_CAPACITY})")
    sub = p.add_subparsers(dest="mode", required=True, metavar="{udp,l2}")

    u = sub.add_parser(
        "udp", help="aggregate over one UDP socket (workers send datagrams to it)",
        description="Serve the pipeline on a UDP socket. Workers are admitted by their source "
                    "address (host, port) as listed in the job files; results go to every "
                    "worker's address.")
    u.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    u.add_argument("--port", type=int, default=wire.DEFAULT_UDP_PORT,
                   help=f"UDP port (default {wire.DEFAULT_UDP_PORT})")
    u.add_argument("--job", action="append", default=[], metavar="FILE",
                   help="job config (JSON or YAML, spina.config.JobConfig fields); repeatable")

    l2 = sub.add_parser(
        "l2", help="switch Ethernet frames between network interfaces (where BMv2 would stand)",
        description="Attach to interfaces with raw sockets (needs CAP_NET_RAW) and run the whole "
                    "P4 pipeline: INA packets addressed to an endpoint are aggregated, anything "
                    "else takes the l2 / ipv4_routes tables. Turn off transmit checksum offload "
                    "on veth peers (ethtool -K IF tx off).")
    l2.add_argument("-i", "--interface", action="append", type=_interface, required=True,
                    metavar="PORT@IF", help="switch port number and interface; repeatable")
    l2.add_argument("--config", metavar="FILE",
                    help="switch config (JSON or YAML): endpoints, l2, routes, jobs, "
                         "qdepth_threshold; see softswitch/README.md")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from spina.config import ConfigError, JobConfig
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        if args.mode == "udp":
            from softswitch.udp import UdpSwitch
            sw = UdpSwitch(args.host, args.port, args.pool_slots, args.slot_capacity)
            for path in args.job:
                sw.add_job(JobConfig.from_dict(_load(path)))
        else:
            from softswitch.l2 import Dataplane, L2Switch, configure
            dp = Dataplane(args.pool_slots, args.slot_capacity)
            if args.config:
                configure(dp, _load(args.config))
            sw = L2Switch(dict(args.interface), dp)
    except (ConfigError, OSError, ValueError) as e:
        print(f"softswitch: {e}", file=sys.stderr)
        return 2
    sw.start()
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    sw.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
