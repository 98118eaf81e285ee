"""python -m host_agent {daemon,launch,status} ...: the host agent's command line."""
import sys

USAGE = """usage: python -m host_agent COMMAND [options]

commands:
  daemon   run the host agent daemon (Unix socket + shared memory for local training processes)
  launch   start a software switch for a local job and write its job file
  status   print a running daemon's counters (--socket PATH)

'python -m host_agent COMMAND --help' describes each command's options."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "daemon":
        from host_agent.daemon import main as daemon_main
        return daemon_main(rest)
    if cmd == "launch":
        from host_agent.launch import main as launch_main
        launch_main(rest)
        return 0
    if cmd == "status":
        import argparse
        import json
        from host_agent.daemon import DEFAULT_SOCKET, status
        ap = argparse.ArgumentParser(prog="python -m host_agent status")
        ap.add_argument("--socket", default=DEFAULT_SOCKET)
        print(json.dumps(status(ap.parse_args(rest).socket), indent=1))
        return 0
    print(f"unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
