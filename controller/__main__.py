"""`python -m controller`: deploy the desired state to the switches, show job counters, add and
remove jobs, reset a job's slots. `python -m controller --help` lists the commands."""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import traceback

from controller.controller import Controller, format_table, run_switches
from controller.p4rt import NotPrimaryError, P4RuntimeError
from controller.state import Job, load
from spina import cli, log as spina_log, spec
from spina.config import ConfigError
from spina.rendezvous import RendezvousServer

DEFAULT_FILE = "spina.yaml"
STOP_GRACE = 10.0  # seconds from SIGTERM to a forced exit, if the last pass is stuck


# The options every command takes, before or after its name (`-c F deploy`, `deploy -c F`).
GLOBAL_DEFAULTS = dict(config=DEFAULT_FILE, election_id=1, timeout=10.0, metrics=None, verbose=0,
                       log_level=None, log_format=spina_log.DEFAULT_FORMAT)


def _global_options(ap: argparse.ArgumentParser) -> None:
    """Add the options every command takes, with no defaults of their own (GLOBAL_DEFAULTS
    fills them in after parsing: a command's copy must not overwrite what came before it)."""
    no = argparse.SUPPRESS
    ap.add_argument("-c", "--config", default=no, metavar="FILE", type=cli.input_file,
                    help=f"desired-state YAML (default {DEFAULT_FILE})")
    ap.add_argument("--election-id", type=cli.int_range(1, (1 << 128) - 1), default=no,
                    help="our P4Runtime election id; the highest connected controller is "
                         "primary and only the primary writes (default 1; status reads "
                         "without one)")
    ap.add_argument("--timeout", type=cli.positive_float, default=no,
                    help="seconds to wait for a switch (default 10)")
    ap.add_argument("--metrics", metavar="[HOST:]PORT", default=no, type=cli.metrics_address,
                    help="with serve or deploy --watch: serve Prometheus metrics polled from "
                         "every switch's P4 counters at http://HOST:PORT/metrics (host default "
                         "127.0.0.1; a wildcard address is refused)")
    ap.add_argument("-v", "--verbose", action="count", default=no,
                    help="more logging (-v INFO, -vv DEBUG); --log-level overrides it")
    spina_log.add_options(ap, level=no, fmt=no)


def _parser(prog: str = "python -m controller") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(
        prog=prog,
        description="SpINA controller: makes the switches of a desired-state YAML file hold its "
                    "jobs (admission, multicast, worker rewrite, forwarding, slot pool) over "
                    "P4Runtime, and writes each host agent's assignment file. "
                    "File format: controller/README.md.")
    _global_options(ap)
    common = cli.ArgumentParser(add_help=False)
    _global_options(common)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    d = sub.add_parser("deploy", parents=[common],
                       help="push pipeline and state; idempotent (twice: no writes)",
                       description="Push the pipeline when the switch's differs, write only what "
                                   "differs from the desired state, clear the slots of jobs "
                                   "that left or arrived, write the agents' files. After a "
                                   "switch restart this restores everything. It starts no "
                                   "runs: agents join each run at the file's `rendezvous`, "
                                   "which `serve` answers (without it they stop at their "
                                   "first call, naming `serve`).")
    d.add_argument("--switch", action="append", metavar="NAME", type=cli.name,
                   help="only this switch (repeatable; default all)")
    d.add_argument("--watch", type=cli.positive_float, metavar="SECONDS",
                   help="keep going: re-read the file and deploy every SECONDS, reconnecting "
                        "to switches that restarted (which restores their state); Ctrl-C stops")
    sv = sub.add_parser("serve", parents=[common],
                        help="deploy, then give every run of a job its own epoch",
                        description="Deploy, then serve the file's `rendezvous` address "
                                    "(default 127.0.0.1:47100): when every rank of a job, flat "
                                    "or fabric, has joined (an agent joins before its first "
                                    "call), the job is admitted with the next epoch on every "
                                    "switch that holds it and its slots there are cleared, so a "
                                    "run never gets another run's sums. Also reconciles like "
                                    "`deploy --watch`. SIGTERM or Ctrl-C stops.")
    sv.add_argument("--watch", type=cli.positive_float, default=2.0, metavar="SECONDS",
                    help="re-read the file and deploy every SECONDS (default %(default)s)")
    st = sub.add_parser("status", parents=[common], help="per-job counters as a table",
                        description="Per-job and per-port counters of every switch, read without "
                                    "an election id (never contests a running `serve`).")
    st.add_argument("--watch", type=cli.positive_float, metavar="SECONDS",
                    help="as `spina status --watch SECONDS`: redraw a live per-job table every "
                         "SECONDS (rates between polls, stalled rounds); Ctrl-C stops")
    st.add_argument("--count", type=cli.int_range(1), metavar="N",
                    help="with --watch: stop after N polls (default: never)")
    job = sub.add_parser("job", parents=[common],
                         help="add or remove a job (updates the file, then applies it)")
    jsub = job.add_subparsers(dest="job_cmd", required=True, metavar="{add,remove}")
    add = jsub.add_parser("add", parents=[common],
                          help="add a job; its slot range is allocated if not given")
    add.add_argument("--id", type=cli.int_range(0, spec.MAX_JOB_ID), required=True,
                     help="job id")
    add.add_argument("--members", required=True, type=cli.names(),
                     help="comma-separated worker names, in rank order")
    add.add_argument("--nslots", type=int, required=True, help="share of the slot pool")
    add.add_argument("--slot-base", type=int, help="first slot (default: first free range)")
    add.add_argument("--block-size", type=int, default=256)
    add.add_argument("--nlanes", type=int, default=56)
    add.add_argument("--epoch", type=int, default=1)
    add.add_argument("--priority", type=int, default=0, help="egress queue 0..7")
    add.add_argument("--drop-qdepth", type=cli.int_range(0, spec.QDEPTH_NEVER),
                     help="drop this job's loss-tolerant packets above this queue depth")
    rm = jsub.add_parser("remove", parents=[common],
                         help="remove a job; its slots are cleared and freed")
    rm.add_argument("--id", type=cli.int_range(0, spec.MAX_JOB_ID), required=True)
    rs = sub.add_parser("reset", parents=[common],
                        help="clear jobs' slot registers and zero their counters")
    rs.add_argument("--job", type=cli.int_range(0, spec.MAX_JOB_ID), action="append",
                    metavar="ID",
                    help="only this job (repeatable; default all)")
    rs.add_argument("--wipe", action="store_true",
                    help="instead: every control clears its own state on every switch (entries, "
                         "groups, threshold, whole slot pool); `deploy` restores the file's state")
    return ap


def _stopping(stop: threading.Event) -> None:
    """SIGTERM: finish the current pass and stop; if the process is still here STOP_GRACE s
    later (a pass blocked on a switch that does not answer), name where it is and exit, so
    that no stopped controller keeps a switch's primary election."""
    if stop.is_set():
        return
    stop.set()

    def force():
        print(f"controller: still running {STOP_GRACE:g} s after SIGTERM; exiting now "
              "(where each thread was follows)", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        os._exit(1)
    t = threading.Timer(STOP_GRACE, force)
    t.daemon = True
    t.start()


def watch(args, ctl: Controller, runs: RendezvousServer | None = None) -> int:
    """deploy --watch (and serve): reconcile forever; a lost switch is reconnected and
    redeployed. With `runs`, each job keeps the epoch of its current run."""
    stop = threading.Event()
    old_term = signal.signal(signal.SIGTERM, lambda *_: _stopping(stop))
    # Python runs a signal handler only when the main thread is back in Python, and a pass can
    # sit in a gRPC call for up to its rpc_timeout (60 s): the wakeup fd gets the signal's
    # number at once, so a thread starts the stop (and its STOP_GRACE exit) meanwhile.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old_wakeup = signal.set_wakeup_fd(wake_w)

    def on_wakeup():
        while data := os.read(wake_r, 64):
            if signal.SIGTERM in data:
                _stopping(stop)
        os.close(wake_r)
    threading.Thread(target=on_wakeup, name="sigterm", daemon=True).start()
    try:
        while not stop.is_set():
            try:
                state = load(args.config)  # `job add` elsewhere shows up here
                if runs is not None:  # (outside ctl.lock: a run's start holds its lock, then ours)
                    runs.set_jobs(state.run_jobs(), run_switches(state))
                with ctl.lock:
                    if runs is not None:  # a job keeps the epoch of its current run
                        current = ctl.state.run_jobs()
                        for j in state.run_jobs():
                            if j in current:
                                state = state.with_epoch(j, current[j][1])
                    ctl.adopt(state)
                    reports = ctl.deploy(getattr(args, "switch", None))
                for r in reports:
                    if r.changed:
                        print(r, flush=True)
            except NotPrimaryError as e:
                print(f"controller: refusing to write: {e}", file=sys.stderr, flush=True)
            except (ConfigError, P4RuntimeError, OSError, ValueError) as e:
                # ValueError: gRPC's closed channel (a switch restarted under a session)
                print(f"controller: {e}; retrying", file=sys.stderr, flush=True)
                ctl.close()  # new sessions next round: new streams, new arbitration
            except Exception as e:  # a reconcile round's bug never ends serve:
                # its rendezvous would close every waiting rank's join with it
                print(f"controller: reconcile failed ({type(e).__name__}: {e}); retrying",
                      file=sys.stderr, flush=True)
                traceback.print_exc(file=sys.stderr)
                ctl.close()
            stop.wait(args.watch)
    except KeyboardInterrupt:
        pass
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGTERM, old_term)  # called in-process (tests): leave it as found
        os.close(wake_w)  # on_wakeup reads b"" and ends
    return 0


def serve(args, ctl: Controller) -> int:
    """`serve`: run the jobs' rendezvous, write the agents' files, then deploy and reconcile
    until stopped. The line "controller: run rendezvous on HOST:PORT, agent files in DIR" comes
    once both are there, so a script that waits for it can start its ranks at once (the
    switches are programmed at each run's start anyway)."""
    runs = ctl.runs(lambda line: print(line, flush=True))
    with runs:  # __enter__ starts it; __exit__ stops it
        with ctl.lock:
            ctl.write_agent_files()
        print(f"controller: run rendezvous on {runs.address[0]}:{runs.address[1]}, agent files "
              f"in {ctl.state.resolve(ctl.state.agents_dir)}", flush=True)
        return watch(args, ctl, runs)


def _with_metrics(args, ctl: Controller) -> int:
    """serve / deploy --watch, with the metrics endpoint running around it if asked."""
    metrics = None
    if args.metrics:
        from controller.metrics import serve_metrics
        metrics = serve_metrics(ctl, args.metrics)
        print(f"metrics {metrics.url}", flush=True)
    try:
        return serve(args, ctl) if args.cmd == "serve" else watch(args, ctl)
    finally:
        if metrics is not None:
            metrics.stop()


def main(argv=None, prog: str = "python -m controller") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = _parser(prog)
    args = ap.parse_args(argv)
    for name, value in GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    if args.cmd == "status" and args.watch is not None:
        # The live table is the `spina` command's (spina_cli/status.py, a layer above this one)
        return cli.fail(ap.prog, "status --watch: run it as `spina status --watch SECONDS`, "
                                 "which redraws the table; `status` alone prints it once")
    spina_log.setup("controller", args.log_level or spina_log.verbosity(args.verbose),
                    args.log_format)
    try:
        long_running = args.cmd == "serve" or (args.cmd == "deploy" and args.watch)
        if args.metrics:
            if not long_running:
                raise ConfigError("--metrics: only with `serve` or `deploy --watch` (a one-shot "
                                  "command exits before anything scrapes it)")
        state = load(args.config)
        # `status` only reads: no election id, so it never contests primary with `serve`.
        election = None if args.cmd == "status" else args.election_id
        with Controller(state, election, timeout=args.timeout) as ctl:
            if long_running:
                return _with_metrics(args, ctl)
            if args.cmd == "deploy":
                for r in ctl.deploy(args.switch):
                    print(r)
            elif args.cmd == "status":
                print(format_table(ctl.status()))
                print()
                print(format_table(ctl.port_status()))
            elif args.cmd == "reset" and args.wipe:
                for name, n in ctl.wipe():
                    print(f"switch {name}: {n} entries and groups deleted, slot pool cleared")
            elif args.cmd == "reset":
                for jid, base, n in ctl.reset(args.job):
                    print(f"job {jid}: slots {base}..{base + n - 1} cleared, counters zeroed")
            elif args.job_cmd == "add":
                job = Job(id=args.id, members=tuple(args.members),
                          nslots=args.nslots, slot_base=args.slot_base,
                          block_size=args.block_size, nlanes=args.nlanes, epoch=args.epoch,
                          priority=args.priority, drop_qdepth=args.drop_qdepth)
                new = state.with_job(job)
                new.save()  # the desired state first: a later `deploy` finishes a failed apply
                j = new.jobs[args.id]
                print(f"job {j.id} added to {args.config}: slots {j.slot_base}.."
                      f"{j.slot_base + j.nslots - 1}")
                for r in ctl.set_state(new):
                    print(r)
            else:
                new = state.without_job(args.id)
                new.save()
                print(f"job {args.id} removed from {args.config}")
                for r in ctl.set_state(new):
                    print(r)
    except NotPrimaryError as e:
        print(f"{ap.prog} {args.cmd}: refusing to write: {cli.one_line(e)}", file=sys.stderr)
        return 3
    except (ConfigError, P4RuntimeError, OSError) as e:
        return cli.fail(f"{ap.prog} {args.cmd}", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
