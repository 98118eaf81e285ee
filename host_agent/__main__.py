"""python -m host_agent {daemon,launch,status} ...: the host agent's command line."""
import sys

USAGE = """usage: python -m host_agent COMMAND [options]

commands:
  daemon   run the host agent daemon (Unix socket + shared memory for local training processes)
  launch   start a software switch for a local job and write its job file
  status   print a running daemon's counters (--socket PATH)

'python -m host_agent COMMAND --help' describes each command's options."""


def format_status(path: str, reply: dict) -> str:
    """A daemon's status reply for people: one line, the counters named."""
    return (f"daemon at {path}: {'ok' if reply.get('ok') else 'NOT ok'}; "
            f"{reply['agents']} job agents attached; calls: {reply['calls_in_progress']} in "
            f"progress, {reply['calls_done']} done; {reply['clients_lost']} clients lost; "
            f"{reply['foreign_packets']} foreign datagrams dropped")


def status_parser(prog: str = "python -m host_agent status"):
    from host_agent.daemon.client import DEFAULT_SOCKET
    from spina import cli
    ap = cli.ArgumentParser(prog=prog, description="Print a running daemon's counters.")
    ap.add_argument("--socket", type=cli.existing_path,
                    help=f"the daemon's Unix socket (default {DEFAULT_SOCKET})")
    ap.add_argument("--json", action="store_true",
                    help="print the daemon's reply as JSON (for scripts)")
    return ap


def main(argv=None, prog: str = "python -m host_agent") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.replace("python -m host_agent", prog))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "daemon":
        from host_agent.daemon.server import main as daemon_main
        return daemon_main(rest, f"{prog} daemon")
    if cmd == "launch":
        from host_agent.launch import main as launch_main
        return launch_main(rest, f"{prog} launch")
    from spina import cli
    if cmd == "status":
        import json

        from host_agent.daemon.client import DEFAULT_SOCKET, status
        ap = status_parser(f"{prog} status")
        args = ap.parse_args(rest)
        args.socket = args.socket or DEFAULT_SOCKET
        try:
            reply = status(args.socket)
        except OSError as e:
            return cli.fail(ap.prog,
                            f"--socket {args.socket}: no daemon answers there "
                            f"({e.strerror or e})")
        print(json.dumps(reply, indent=1) if args.json else format_status(args.socket, reply))
        return 0
    return cli.fail(prog, f"unknown command {cmd!r} (choose from daemon, launch, status; --help)")

if __name__ == "__main__":
    sys.exit(main())
