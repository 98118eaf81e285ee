"""`python -m softswitch`: run the SpINA software switch as a long-lived process.

    python -m softswitch udp --jobs jobs.yaml                      # UDP aggregator
    python -m softswitch l2 -i 1@veth1 -i 2@veth2 --config sw.yaml  # where BMv2 would stand
    python -m softswitch udp --grpc                                # tables from the controller

`python -m softswitch <mode> --help` explains each mode's options.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from softswitch.pipeline import (
    DEFAULT_POOL_SLOTS,
    MAX_POOL_SLOTS,
    MAX_REGISTER_BYTES,
    register_bytes,
)
from softswitch.udp import MAX_DATAPATH_THREADS
from spina import cli, log as spina_log, wire
from spina.config import ConfigError, JobConfig
from spina.spec import DEFAULT_SLOT_CAPACITY


def _load(path: str):
    """A JSON or YAML file's document; a missing or unparsable file is a ConfigError naming it."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    if path.endswith((".yaml", ".yml")):
        import yaml
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not YAML: {e}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON: {e}") from None


def load_jobs(path: str) -> list[JobConfig]:
    """Jobs from a JSON or YAML file: a list of jobs, or {"jobs": [...]}."""
    doc = _load(path)
    jobs = doc.get("jobs") if isinstance(doc, dict) else doc
    if not isinstance(jobs, list):
        raise ConfigError(f"{path}: expected a list of jobs or a mapping with field 'jobs'")
    out, ids = [], {}
    for i, j in enumerate(jobs):
        try:
            job = JobConfig.from_dict(j)
        except ConfigError as e:
            raise ConfigError(f"{path}: jobs[{i}]: {e}") from None
        if job.job in ids:
            raise ConfigError(f"{path}: jobs[{i}]: field 'job': job {job.job} is also "
                              f"jobs[{ids[job.job]}]")
        ids[job.job] = i
        out.append(job)
    return out


MAX_SLOT_CAPACITY = wire.MAX_LANES * 65535  # the largest nlanes * block_size a job can ask for


@cli.refuses("lo", "x@lo", "1@")
def _interface(text: str) -> tuple[int, str]:
    port, sep, name = text.partition("@")
    if not sep or not port.isdigit() or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT@INTERFACE, e.g. 1@veth1")
    return int(port), name


@cli.refuses("1", "1:0", "x:100")
def _queue_rate(text: str) -> tuple[int, int]:
    port, sep, pps = text.partition(":")
    if not sep or not port.isdigit() or not pps.isdigit() or int(pps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT:PPS with a rate of at least "
                                         "1 packet a second, e.g. 2:50000")
    return int(port), int(pps)


def _port_rate(text: str):
    """PORT:RATE (a cli.parsed_by parser: ValueError names what is wrong)."""
    from softswitch.egress import parse_port_rate
    port, sep, rate = text.partition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r}: expected PORT:RATE, e.g. 2:1gbit or 2:8000pps")
    return int(port), parse_port_rate(rate)


def _pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool-slots", type=cli.int_range(1, MAX_POOL_SLOTS),
                   default=DEFAULT_POOL_SLOTS,
                   help="slots in the register pool, shared by all jobs "
                        f"(1..{MAX_POOL_SLOTS}, default %(default)s)")
    p.add_argument("--slot-capacity", type=cli.int_range(1, MAX_SLOT_CAPACITY),
                   default=DEFAULT_SLOT_CAPACITY,
                   help="int32 elements per slot copy = largest nlanes*block_size "
                        f"(1..{MAX_SLOT_CAPACITY}, default %(default)s); the slot registers "
                        f"(about 8 bytes x pool slots x capacity) may take at most "
                        f"{MAX_REGISTER_BYTES >> 30} GiB")
    p.add_argument("--grpc", nargs="?", const="127.0.0.1:9559", metavar="ADDR",
                   type=cli.parsed_by(_loopback, "address", bad=("0.0.0.0:9559", "127.0.0.1:x",
                                                                  "127.0.0.1:99999")),
                   help="serve P4Runtime on ADDR (default 127.0.0.1:9559 when given without "
                        "one; loopback only; port 0 picks a free one) so the controller writes "
                        "the tables")
    p.add_argument("--device-id", type=cli.int_range(0, (1 << 64) - 1), default=0,
                   help="P4Runtime device id (default %(default)s)")
    p.add_argument("--metrics", metavar="[HOST:]PORT", type=cli.metrics_address,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (host default "
                        "127.0.0.1; a wildcard address is refused; port 0 picks one and prints "
                        "it). Names: docs/operations.md")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="more logging (-v: per packet); --log-level overrides it")
    spina_log.add_options(p, level=None)


def _check_args(ap: argparse.ArgumentParser, args) -> None:
    """What no single option's type can check: the memory the pool would take, --grpc."""
    need = register_bytes(args.pool_slots, args.slot_capacity)
    if need > MAX_REGISTER_BYTES:
        ap.error(f"argument --pool-slots/--slot-capacity: {args.pool_slots} slots of "
                 f"{args.slot_capacity} elements need {need / (1 << 30):.1f} GiB of slot "
                 f"registers, more than the bound of {MAX_REGISTER_BYTES >> 30} GiB")
    if args.grpc:
        if getattr(args, "jobs", None) or getattr(args, "config", None):
            ap.error("argument --grpc: the controller writes the tables; drop --jobs/--config")
    if args.mode == "udp" and args.datapath_threads > 1 and args.datapath != "compiled":
        ap.error("argument --datapath-threads: more than 1 needs --datapath compiled")
    if args.mode == "udp" and (args.plan is None) != (args.switch is None):
        ap.error("argument --plan/--switch: give both (the plan, and which switch of it this is)")
    if args.mode == "udp" and args.plan is not None and (args.jobs or args.grpc):
        ap.error("argument --plan: the file gives this switch's jobs and P4Runtime address; "
                 "drop --jobs/--grpc")


# The controller writes this switch's tables in every mode: over gRPC (--grpc) or, from a file
# given here, in process through the switch's own P4Runtime servicer. This entry point may import
# the controller; the softswitch package itself does not.
def _program(servicer, state, path: str) -> None:
    from controller.controller import program_in_process
    from controller.p4rt import P4RuntimeError
    try:
        for report in program_in_process(servicer, state):
            logging.getLogger("spina.softswitch").info("%s: %s", path, report)
    except P4RuntimeError as e:
        raise ConfigError(f"{path}: {e}") from None


def program_from_config(dp, path: str, device_id: int = 0) -> None:
    """Fill an L2 Dataplane's tables from the switch config in `path` (softswitch/README.md),
    made a desired state by controller.softswitch_files.from_l2_config."""
    from controller.softswitch_files import from_l2_config
    from softswitch.p4runtime_server import SoftSwitchServicer
    doc = _load(path)
    try:
        state = from_l2_config(doc, pool_slots=dp.pipeline.pool_slots,
                               slot_capacity=dp.pipeline.slot_capacity)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    _program(SoftSwitchServicer(dp, device_id), state, path)


def program_udp_jobs(sw, jobs: list[JobConfig], path: str, device_id: int = 0) -> None:
    """Admit the jobs of `path` on a UdpSwitch: controller.softswitch_files.from_udp_jobs,
    written through the switch's own P4Runtime servicer."""
    from controller.softswitch_files import from_udp_jobs
    try:
        state = from_udp_jobs(jobs, address=sw.address[0], udp_port=sw.address[1],
                              pool_slots=sw.pipeline.pool_slots,
                              slot_capacity=sw.pipeline.slot_capacity)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    _program(sw.servicer(device_id), state, path)


def _plan_switch(args):
    """(switch, its P4Runtime server, its level): switch NAME of the desired state in
    `--plan` in UDP mode, at that switch's address and UDP port, serving P4Runtime at its
    `grpc` address (so that `controller serve -c PLAN` starts each run there) and programmed
    with its share of the state (flat jobs and fabric roles) by the controller, in process."""
    from controller.controller import program_in_process
    from controller.p4rt import P4RuntimeError
    from controller.state import load
    from softswitch.p4runtime_server import P4RuntimeServer, check_loopback
    from softswitch.udp import UdpSwitch
    try:
        state = load(args.plan)
    except ConfigError as e:
        raise ConfigError(f"argument --plan: {e}") from None
    me = state.switches.get(args.switch)
    if me is None:
        raise ConfigError(f"argument --switch: {args.switch!r} is not a switch of {args.plan} "
                          f"(it has {', '.join(state.switches)})")
    if me.target != "softswitch":
        raise ConfigError(f"argument --switch: {args.plan}: switches.{me.name}.target is "
                          f"{me.target}, not softswitch")
    try:
        check_loopback(me.grpc)
    except ValueError as e:
        raise ConfigError(f"argument --plan: {args.plan}: switches.{me.name}.grpc: {e} (a --plan "
                          "switch serves P4Runtime there, so that `controller serve -c PLAN` "
                          "can start each run of its jobs)") from None
    try:
        sw = UdpSwitch(me.address, me.udp_port, args.pool_slots, args.slot_capacity,
                       datapath=args.datapath, datapath_threads=args.datapath_threads)
    except OSError as e:
        raise ConfigError(f"argument --plan: cannot listen on {me.address}:{me.udp_port} "
                          f"(switch {me.name}): {e.strerror or e}") from None
    try:
        server = P4RuntimeServer(sw.dataplane, me.grpc, me.device_id,
                                 servicer=sw.servicer(me.device_id))
        program_in_process({me.name: server.servicer}, state, [me.name])
    except (OSError, ConfigError, P4RuntimeError) as e:
        sw.stop()
        raise ConfigError(f"argument --plan: {args.plan}: switch {me.name}: {e}") from None
    level = state.fabric.levels.get(me.name, "flat") if state.fabric is not None else "flat"
    return sw, server, level


def _loopback(text: str) -> str:
    from softswitch.p4runtime_server import check_loopback  # (grpc: imported when asked)
    return check_loopback(text)


def parser(prog: str = "python -m softswitch") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(
        prog=prog,
        description="SpINA software switch: sums the non-zero gradient blocks of every admitted "
                    "job's workers and multicasts the results. Same pipeline as the P4 program.")
    sub = ap.add_subparsers(dest="mode", required=True, metavar="{udp,l2}")

    udp = sub.add_parser(
        "udp", help="serve on a UDP socket (the software aggregator)",
        description="Serve the pipeline on one UDP socket. Workers are admitted by their "
                    "source (address, port) as listed in the jobs file; results go to every "
                    "worker's address.")
    udp.add_argument("--host", type=cli.ipv4_host, default="127.0.0.1",
                     help="IPv4 address (or name) to listen on (default %(default)s)")
    udp.add_argument("--port", type=cli.int_range(0, 65535, " (0: any free)"),
                     default=wire.DEFAULT_UDP_PORT,
                     help="UDP port (default %(default)s; 0 picks a free one and prints it)")
    udp.add_argument("--jobs", metavar="FILE", type=cli.input_file,
                     help="JSON/YAML file of jobs to admit at start")
    udp.add_argument("--plan", metavar="FILE", type=cli.input_file,
                     help="a controller desired state, with or without a `fabric` section "
                          "(docs/scale_out.md): serve as the switch named by --switch, at its "
                          "address and UDP port in the file, with P4Runtime at its `grpc` "
                          "address (loopback HOST:PORT; `python -m controller -c FILE serve` "
                          "starts each run there), programmed with its share of the file at "
                          "start (flat jobs, leaf or spine roles)")
    udp.add_argument("--switch", metavar="NAME", type=cli.name,
                     help="with --plan: which of the file's switches this is")
    udp.add_argument("--datapath", choices=("compiled", "python"), default="compiled",
                     help="compiled (softswitch/_datapath.c, built by make setup: a flat job's "
                          "contributions in C, everything else in Python) or python (every packet "
                          "through the Python pipeline, the reference; for comparison). Default "
                          "%(default)s")
    udp.add_argument("--datapath-threads", type=cli.int_range(1, MAX_DATAPATH_THREADS),
                     default=1, metavar="N",
                     help=f"compiled data-path threads (1..{MAX_DATAPATH_THREADS}, default "
                          "%(default)s), each on its own socket behind the one address, serving "
                          "the slots s with s %% N equal to its index: a switch that uses N "
                          "cores; more than 1 needs --datapath compiled")
    _pool_args(udp)

    l2 = sub.add_parser(
        "l2", help="switch Ethernet frames between interfaces (where BMv2 would stand)",
        description="Attach to network interfaces with raw sockets (needs CAP_NET_RAW) and run "
                    "the whole P4 pipeline: INA packets addressed to an endpoint are aggregated, "
                    "anything else takes the l2 / ipv4_routes tables. Turn transmit checksum "
                    "offload off on veth peers (ethtool -K IF tx off). Config format: "
                    "softswitch/README.md.")
    l2.add_argument("-i", "--interface", action="append", type=_interface, required=True,
                    metavar="PORT@IF", help="switch port number and interface; repeatable")
    l2.add_argument("--queue-rate", action="append", type=_queue_rate, default=[],
                    metavar="PORT:PPS",
                    help="limit each priority queue of egress port PORT to PPS frames a second "
                         "(BMv2's set_queue_rate; softswitch/egress.py): frames then queue by "
                         "priority and enq_qdepth is measured; repeatable; default: no limit")
    l2.add_argument("--port-rate", action="append", default=[], metavar="PORT:RATE",
                    type=cli.parsed_by(_port_rate, "port rate", bad=("1", "x:1gbit", "1:fast")),
                    help="shape egress port PORT as one link of RATE (bits/s: 400mbit, 1gbit; "
                         "frames/s: 8000pps; or both, 8000pps,1gbit): strict priority between "
                         "its queues, a frame's link time taken when it leaves egress, so a "
                         "frame the congestion drop takes uses none. Unlike --queue-rate "
                         "(BMv2's model: each priority queue drained at its own rate, no "
                         "competition between them), which BMv2 lacks; repeatable; a port has "
                         "one or the other")
    l2.add_argument("--datapath", choices=("compiled", "python"), default="compiled",
                    help="compiled (softswitch/_datapath_l2.c, built by make setup: a flat job's "
                         "contribution frames, from an admitted sender to an endpoint, "
                         "aggregated and their result copies built in C, batched per port; "
                         "every other frame, and every frame while a port has a --queue-rate "
                         "or --port-rate, through the Python pipeline in arrival order) or "
                         "python (every frame through the Python pipeline, the reference; for "
                         "comparison). Default %(default)s")
    l2.add_argument("--config", metavar="FILE", type=cli.input_file,
                    help="switch config (JSON/YAML): endpoints, l2, routes, jobs, "
                         "qdepth_threshold")
    _pool_args(l2)
    return ap


def main(argv=None, prog: str = "python -m softswitch") -> int:
    ap = parser(prog)
    args = ap.parse_args(argv)
    _check_args(ap, args)
    spina_log.setup("switch", args.log_level or spina_log.verbosity(args.verbose, "INFO"),
                    args.log_format)
    server = metrics = sw = None
    lines = []  # printed once every address is bound: on a failure its error is the one line
    try:
        if args.mode == "udp" and args.plan:
            sw, server, level = _plan_switch(args)
            lines.append(f"listening {sw.address[0]}:{sw.address[1]} as {level} {args.switch}")
            server.start()
            lines.append(f"p4runtime {server.address} device {server.servicer.device_id}")
        elif args.mode == "udp":
            jobs = load_jobs(args.jobs) if args.jobs else []
            from softswitch.udp import UdpSwitch
            try:
                sw = UdpSwitch(args.host, args.port, args.pool_slots, args.slot_capacity,
                               datapath=args.datapath, datapath_threads=args.datapath_threads)
            except OSError as e:
                raise ConfigError(f"argument --host/--port: cannot listen on "
                                  f"{args.host}:{args.port}: {e.strerror or e}") from None
            if jobs:
                program_udp_jobs(sw, jobs, args.jobs, args.device_id)
            dp = sw.dataplane
            lines.append(f"listening {sw.address[0]}:{sw.address[1]}")
        else:
            from softswitch.dataplane import Dataplane
            from softswitch.l2 import L2Switch
            ports = dict(args.interface)
            # Rows naming a port this switch lacks are refused (the frames would go nowhere).
            dp = Dataplane(args.pool_slots, args.slot_capacity, ports=set(ports),
                           datapath=args.datapath)
            if args.config:
                program_from_config(dp, args.config, args.device_id)
            for port, pps in args.queue_rate:
                if port not in ports:
                    raise ConfigError(f"argument --queue-rate: port {port} is not a switch port "
                                      f"(-i gives {', '.join(map(str, sorted(ports)))})")
                dp.set_queue_rate(port, pps)
            for port, rate in args.port_rate:
                if port not in ports:
                    raise ConfigError(f"argument --port-rate: port {port} is not a switch port "
                                      f"(-i gives {', '.join(map(str, sorted(ports)))})")
                if port in dict(args.queue_rate):
                    raise ConfigError(f"argument --port-rate: port {port} also has a "
                                      "--queue-rate; a port has one or the other")
                dp.set_port_rate(port, rate)
            sw = L2Switch(ports, dp)
            lines.append("switching " + " ".join(f"{p}@{i}" for p, i in args.interface))
        if args.metrics:
            from softswitch.metrics import serve_metrics
            try:
                metrics = serve_metrics(sw.pipeline if args.mode == "udp" else dp.pipeline, sw,
                                        args.metrics)
            except OSError as e:
                raise ConfigError(f"argument --metrics: {e.strerror or e}") from None
            lines.append(f"metrics {metrics.url}")
        if args.grpc:
            from softswitch.p4runtime_server import P4RuntimeServer
            try:
                server = P4RuntimeServer(dp, args.grpc, args.device_id,
                                         servicer=sw.servicer(args.device_id)
                                         if args.mode == "udp" else None).start()
            except OSError as e:
                raise ConfigError(f"argument --grpc: {e.strerror or e}") from None
            lines.append(f"p4runtime {server.address} device {args.device_id}")
    except (ConfigError, OSError, ValueError) as e:
        for started in (server, metrics, sw):
            if started is not None:
                started.stop()
        return cli.fail(f"{ap.prog} {args.mode}", e)
    print("\n".join(lines), flush=True)
    done = threading.Event()
    # Ctrl-C and SIGTERM both end the wait; the shutdown below then runs without a
    # KeyboardInterrupt landing in the middle of stopping the servers.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    sw.start()
    done.wait()
    if server is not None:
        server.stop()
    if metrics is not None:
        metrics.stop()
    sw.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while starting: nothing to clean up yet
        sys.exit(130)
