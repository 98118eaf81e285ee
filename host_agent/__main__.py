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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "daemon":
        from host_agent.daemon.server import main as daemon_main
        return daemon_main(rest)
    if cmd == "launch":
        from host_agent.launch import main as launch_main
        return launch_main(rest)
    if cmd == "status":
        import json

        from host_agent.daemon.client import DEFAULT_SOCKET, status
        from spina import cli
        ap = cli.ArgumentParser(prog="python -m host_agent status")
        ap.add_argument("--socket", default=DEFAULT_SOCKET, help="the daemon's Unix socket "
                                                                 "(default %(default)s)")
        ap.add_argument("--json", action="store_true",
                        help="print the daemon's reply as JSON (for scripts)")
        args = ap.parse_args(rest)
        try:
            reply = status(args.socket)
        except OSError as e:
            return cli.fail(ap.prog,
                            f"--socket {args.socket}: no daemon answers there "
                            f"({e.strerror or e})")
        print(json.dumps(reply, indent=1) if args.json else format_status(args.socket, reply))
        return 0
    from spina import cli
    return cli.fail("python -m host_agent",
                    f"unknown command {cmd!r} (choose from daemon, launch, status; --help)")


if __name__ == "__main__":
    sys.exit(main())
