"""`python -m softswitch`: run the SpINA software switch as a long-lived process."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from softswitch.pipeline import DEFAULT_POOL_SLOTS, DEFAULT_SLOT_CAPACITY
from softswitch.udp import UdpSwitch
from spina import wire
from spina.config import ConfigError, JobConfig


def load_jobs(path: str) -> list[JobConfig]:
    """Jobs from a JSON or YAML file: a list of jobs, or {"jobs": [...]}."""
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml
        doc = yaml.safe_load(text)
    else:
        doc = json.loads(text)
    jobs = doc.get("jobs") if isinstance(doc, dict) else doc
    if not isinstance(jobs, list):
        raise ConfigError(f"{path}: expected a list of jobs or a mapping with field 'jobs'")
    out = []
    for i, j in enumerate(jobs):
        try:
            out.append(JobConfig.from_dict(j))
        except ConfigError as e:
            raise ConfigError(f"{path}: jobs[{i}]: {e}") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m softswitch",
        description="SpINA software switch: sums the non-zero gradient blocks of every admitted "
                    "job's workers and multicasts the results. Same pipeline as the P4 program.")
    sub = ap.add_subparsers(dest="mode", required=True)
    udp = sub.add_parser("udp", help="serve on a UDP socket (the software aggregator)")
    udp.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    udp.add_argument("--port", type=int, default=wire.DEFAULT_UDP_PORT,
                     help="UDP port (default %(default)s; 0 picks a free one and prints it)")
    udp.add_argument("--jobs", metavar="FILE", help="JSON/YAML file of jobs to admit at start")
    udp.add_argument("--pool-slots", type=int, default=DEFAULT_POOL_SLOTS,
                     help="slots in the register pool, shared by all jobs (default %(default)s)")
    udp.add_argument("--slot-capacity", type=int, default=DEFAULT_SLOT_CAPACITY,
                     help="int32 elements per slot copy = largest nlanes*block_size (default %(default)s)")
    udp.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: per packet)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose + 1, 2),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        jobs = load_jobs(args.jobs) if args.jobs else []
        sw = UdpSwitch(args.host, args.port, args.pool_slots, args.slot_capacity)
        for j in jobs:
            sw.add_job(j)
    except (ConfigError, OSError) as e:
        print(f"softswitch: error: {e}", file=sys.stderr)
        return 2
    print(f"listening {sw.address[0]}:{sw.address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sw.shutdown())
    try:
        sw.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sw.sock.close()
        for j in jobs:
            logging.getLogger("spina.softswitch").info("job %d counters: %s", j.job,
                                                       sw.pipeline.job_counters(j.job))
    return 0


if __name__ == "__main__":
    sys.exit(main())
