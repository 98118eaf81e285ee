"""Launch one job on this machine: a software switch plus the job file its workers read.

    python -m host_agent.launch --nworkers 4 --job-file /tmp/spina-job.json

picks a free loopback UDP port for every rank and for the switch, admits the job on a software
switch (softswitch.udp.UdpSwitch), starts the job's run rendezvous (spina.rendezvous: every
program that uses the job file gets an epoch of its own, so consecutive programs never see each
other's sums), writes the job file (spina.config.JobFile) once both listen, and serves until
SIGTERM or SIGINT (then removes the job file). Training processes then create their agent with
`host_agent.assignment.agent_from_env(job_file)`: no port is ever copied by hand.
`--communication JSON` puts a communication section in the file (spina/communication.py): the
DDP hook every worker's `host_agent.hooks.register_from_job` then registers.

Ports are chosen by binding port 0 and releasing it; on loopback the window in which another
program could take one of them before the worker binds it is small, and a clash shows up as
an `OSError: address in use` at the worker, never as silent cross-talk (the switch admits a
worker only from its registered address).
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import replace
from pathlib import Path

from softswitch.udp import UdpSwitch
from spina import cli, log as spina_log, wire
from spina.communication import Communication
from spina.config import JOB_FIELDS, ConfigError, JobConfig, JobFile, WorkerAddr
from spina.net import bind_own_address, free_ports
from spina.rendezvous import RendezvousServer

log = logging.getLogger("spina.launch")


def local_job(nworkers: int, job: int = 1, host: str = "127.0.0.1", **job_fields) -> JobConfig:
    """A job whose `nworkers` ranks live on `host`, each on a free UDP port."""
    ports = free_ports(nworkers, host)
    return JobConfig(job=job, workers=tuple(WorkerAddr(r, host, p) for r, p in enumerate(ports)),
                     **job_fields).validate()


class RepeatFilter(logging.Filter):
    """Let the first `keep` records with the same message and exception type through, count the
    rest.

    A data-plane bug hit by every resend would otherwise print a traceback per packet and
    bury everything else; `summary()` says how many were held back.
    """

    def __init__(self, keep: int = 3):
        super().__init__()
        self.keep = keep
        self.seen: dict[tuple, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.msg, exc)
        n = self.seen[key] = self.seen.get(key, 0) + 1
        return n <= self.keep

    def summary(self) -> list[str]:
        return [f"{n - self.keep} more of {name}: {msg!r} {exc}".rstrip()
                for (name, msg, exc), n in self.seen.items() if n > self.keep]


def serve(job_file: str, nworkers: int, job: int = 1, host: str = "127.0.0.1",
          switch_port: int = 0, stop: threading.Event | None = None,
          communication: Communication | None = None, metrics: str | None = None,
          **job_fields) -> None:
    """Start a switch for a fresh local job, write `job_file` (with `communication`, the DDP
    hook its workers register: spina.communication), serve until `stop` is set. With
    `metrics` ([HOST:]PORT) the switch's counters are served there, as `spina switch
    --metrics` serves them."""
    cfg = local_job(nworkers, job, host, **job_fields)
    if communication is not None:
        communication.check_lanes(cfg.lane_bits)  # before a switch starts
    repeats = RepeatFilter()
    logging.getLogger("spina.softswitch").addFilter(repeats)
    switch = UdpSwitch(host=host, port=switch_port)
    endpoint = None
    if metrics is not None:
        from softswitch.metrics import serve_metrics
        try:
            endpoint = serve_metrics(switch.pipeline, switch, metrics)
        except OSError as e:
            switch.stop()
            raise ConfigError(f"--metrics: {e.strerror or e}") from None
        print(f"metrics {endpoint.url}", flush=True)
    switch.add_job(cfg)
    switch.start()

    def new_run(job: int, epoch: int) -> None:  # re-admit with the run's epoch: slots cleared
        switch.add_job(replace(cfg, epoch=epoch))

    runs = RendezvousServer(host, 0, {cfg.job: (cfg.nworkers, cfg.epoch)}, new_run,
                            owner="launcher", source=os.path.abspath(job_file),
                            switches={cfg.job: {"{}:{}".format(*switch.address)}}).start()
    JobFile(cfg, switch.address, runs.address, communication).write(job_file)
    log.info("%d workers, switch on %s:%d, run rendezvous on %s:%d, job file %s",
             nworkers, *switch.address, *runs.address, job_file,
             extra=spina_log.fields(job=cfg.job, epoch=cfg.epoch))
    stop = stop or threading.Event()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        runs.stop()
        if endpoint is not None:
            endpoint.stop()
        switch.stop()
        try:
            os.unlink(job_file)  # the job is gone: no file may point workers at a dead switch
        except FileNotFoundError:
            pass
        logging.getLogger("spina.softswitch").removeFilter(repeats)
        for line in repeats.summary():
            log.warning("suppressed %s", line)
        log.info("switch stopped: %d packets in (%d bytes), %d out (%d bytes); %d runs",
                 switch.packets_in, switch.bytes_in, switch.packets_out, switch.bytes_out,
                 runs.runs_started)


def start_subprocess(nworkers: int, job_file: str | None = None, log_level: str = "WARNING",
                     log_format: str = spina_log.DEFAULT_FORMAT,
                     **kw) -> tuple[subprocess.Popen, str]:
    """Run `python -m host_agent.launch` in a child process; returns (process, job file path).

    For examples and tests that want a switch of their own; stop it with `terminate()` (SIGTERM,
    a clean exit) and `wait()`. The child imports this checkout's packages.
    """
    if job_file is None:  # removed by the launcher when it stops
        job_file = os.path.join(tempfile.gettempdir(), f"spina-job-{uuid.uuid4().hex}.json")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "host_agent.launch", "--nworkers", str(nworkers),
           "--job-file", job_file, "--log-level", log_level, "--log-format", log_format]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(cmd, env=env, cwd=root), job_file


def shared_job_file(job_file: str | None = None,
                    **options) -> tuple[subprocess.Popen | None, str]:
    """In a torch.distributed group: the job file every rank uses, and the switch process if
    this rank started one. With `job_file` given (a deployed switch), nothing is started;
    otherwise rank 0 starts a software switch with `start_subprocess` (`options`: the
    launcher's, e.g. lane_bits=16) and tells the others where its job file is. Stop the
    returned process (rank 0 only) after the last call.
    """
    import torch.distributed as dist
    if job_file is not None:
        return None, job_file
    switch = None
    box = [None]
    if dist.get_rank() == 0:
        switch, box[0] = start_subprocess(dist.get_world_size(), **options)
    dist.broadcast_object_list(box, src=0)
    return switch, box[0]


def finish_shared_job(agent, switch: subprocess.Popen | None) -> None:
    """The end of a job that `shared_job_file` set up: wait until every rank is done with the
    switch, close this rank's agent, and stop the switch if this rank started it."""
    import torch.distributed as dist
    dist.barrier()
    agent.close()
    if switch is not None:
        switch.terminate()
        switch.wait(timeout=10)  # the launcher removes its job file


def parser(prog: str = "python -m host_agent.launch") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--nworkers", type=cli.int_range(1, wire.MAX_WORKERS), required=True,
                    help=f"ranks in the job (1..{wire.MAX_WORKERS}: the launcher runs one flat "
                         "switch; more workers need a leaf/spine fabric, docs/scale_out.md)")
    ap.add_argument("--job-file", required=True, type=cli.output_file,
                    help="where to write the job file (JSON)")
    ap.add_argument("--job", type=cli.int_range(0, 65535), default=1, help="job id (default 1)")
    ap.add_argument("--host", type=_local_ipv4, default="127.0.0.1",
                    help="address of the switch and the workers (an address of this host)")
    ap.add_argument("--switch-port", type=cli.int_range(0, 65535, " (0: any free)"), default=0,
                    help="switch UDP port (0: any free)")
    lanes = JOB_FIELDS["lane_bits"]  # the job schema's declaration, not a copy of it
    ap.add_argument("--lane-bits", type=int, choices=lanes.metadata["choices"],
                    default=lanes.default,
                    help=f"{lanes.metadata['help']} (default: {lanes.default})")
    ap.add_argument("--communication", type=cli.parsed_by(
                        _communication, "communication", bad=("{", "[]", '{"method": "x"}')),
                    help="the job file's communication section, as JSON: how the workers' DDP "
                         "models communicate, e.g. '{\"method\": \"topk\", \"ratio\": 0.01}' "
                         "(default dense SpINA; spina/communication.py, docs/bits.md)")
    ap.add_argument("--metrics", metavar="[HOST:]PORT", type=cli.metrics_address,
                    help="serve the switch's Prometheus metrics at http://HOST:PORT/metrics "
                         "(as `spina switch --metrics`; host default 127.0.0.1, port 0 picks "
                         "one and prints it)")
    spina_log.add_options(ap)
    return ap


def main(argv=None, prog: str = "python -m host_agent.launch") -> int:
    ap = parser(prog)
    args = ap.parse_args(argv)
    spina_log.setup("launch", args.log_level, args.log_format)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve(args.job_file, args.nworkers, args.job, args.host, args.switch_port, stop,
              args.communication, args.metrics, lane_bits=args.lane_bits)
    except (ConfigError, OSError) as e:
        return cli.fail(ap.prog, e)
    return 0


def _communication(text: str) -> Communication:
    """An argparse type: a communication section as JSON (its ConfigError names the field)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e})") from None
    return Communication.from_dict(doc)


@cli.refuses("0.0.0.0", "192.0.2.1", "my-laptop")
def _local_ipv4(text: str) -> str:
    """An argparse type: one IPv4 address of this host (the workers bind it; no wildcard)."""
    try:
        ipaddress.IPv4Address(text)
        bind_own_address(text, 0, "the workers bind it").close()
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    except (ValueError, OSError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address of this host") from None
    return text


if __name__ == "__main__":
    sys.exit(main())
