"""`spina`: one command for every SpINA process and tool (docs/operations.md).

    spina switch udp --grpc --metrics 9100     # python -m softswitch
    spina deploy -c spina.yaml                 # python -m controller deploy (also serve, job,
    spina status -c spina.yaml --watch 2       #   reset; status --watch redraws a per-job table)
    spina agent daemon --config agent.json     # python -m host_agent
    spina demo | spina bench | spina capture FILE | spina doctor -c spina.yaml
    spina plan topo.yaml --size 64MiB          # collectives: pick an algorithm (spina_cli/plan.py)

The dispatcher lives outside spina/ (the shared core imports nothing above it) and hands the
rest of the command line to each component's own main; the `python -m` forms stay.
"""
from __future__ import annotations

import sys

# name -> (one-line help, how to run it)
COMMANDS = {
    "switch": "run the software switch (udp or l2 mode; P4Runtime with --grpc)",
    "deploy": "controller: push pipeline and jobs of a desired-state file (--watch: keep going)",
    "serve": "controller: deploy, reconcile, and give each run of a job its own epoch",
    "status": "controller: per-job counters (--watch SECONDS: redraw a live table)",
    "job": "controller: add or remove a job",
    "reset": "controller: clear job slots and counters (--wipe: everything)",
    "agent": "host agent: launch | daemon | status",
    "demo": "software switch + 4 workers all-reduce, against gloo",
    "bench": "the benchmark harness: spina bench WHAT (needs a clone: bench/ is not installed)",
    "capture": "decode a packet capture's SpINA packets (pcap from tshark/tcpdump)",
    "doctor": "check a deployment: switch, pipeline, admission, addresses, MTU, epochs",
    "plan": "predict each collective algorithm's time on a topology file and pick one",
}
USAGE = "usage: spina COMMAND [options]\n\ncommands:\n" + "\n".join(
    f"  {name:<8} {text}" for name, text in COMMANDS.items()) + (
    "\n\n'spina COMMAND --help' explains each command's options; 'spina --version' prints "
    "the version; docs/operations.md walks through a deployment.")


# Every command's argparse parser, as "module:function" called with the prog the user typed;
# tests/test_bad_input.py walks each one's options (and its subcommands'), so an option added
# anywhere is fed bad values. Each command of COMMANDS is here, under its own name or as the
# first word of its entries.
PARSERS = {
    "switch": "softswitch.__main__:parser",
    "deploy": "controller.__main__:_parser",  # one parser: deploy, serve, status, job, reset
    "agent launch": "host_agent.launch:parser",
    "agent daemon": "host_agent.daemon.server:parser",
    "agent status": "host_agent.__main__:status_parser",
    "status --watch": "spina_cli.status:parser",
    "demo": "spina_cli.demo:parser",
    "bench": "bench.harness:command_parser",  # each WHAT a subcommand
    "capture": "spina_cli.capture:parser",
    "doctor": "spina_cli.doctor:parser",
    "plan": "spina_cli.plan:parser",
}
CONTROLLER = ("deploy", "serve", "status", "job", "reset")  # controller/__main__.py's commands
# command -> the module whose main(argv, prog) runs it
MAINS = {"switch": "softswitch.__main__", "agent": "host_agent.__main__",
         "demo": "spina_cli.demo", "capture": "spina_cli.capture", "doctor": "spina_cli.doctor",
         "plan": "spina_cli.plan"}


def main(argv=None) -> int:
    import importlib
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] == "--version":
        from spina import version
        v = version()
        print(f"spina {v}" if v != "unknown" else "spina (not installed: run make setup)")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "status" and any(a == "--watch" or a.startswith("--watch=") for a in rest):
        from spina_cli.status import main as run  # the live table (the controller prints once)
        return run(rest, "spina status")
    if cmd in CONTROLLER:
        from controller.__main__ import main as run
        return run([cmd] + rest, prog="spina")
    if cmd == "bench":
        try:
            from bench.harness import main as run
        except ImportError:
            print("spina bench: error: the bench/ package is not importable; run it from a "
                  "clone of the repository (make bench)", file=sys.stderr)
            return 2
        return run(rest, "spina bench")
    if cmd in MAINS:
        return importlib.import_module(MAINS[cmd]).main(rest, f"spina {cmd}")
    print(f"spina: error: unknown command {cmd!r} (spina --help lists them)", file=sys.stderr)
    return 2

if __name__ == "__main__":
    sys.exit(main())
