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
        return launch_main(rest)
    if cmd == "status":
        import json

        from host_agent.daemon import DEFAULT_SOCKET, status
        from spina import cli
        ap = cli.ArgumentParser(prog="python -m host_agent status")
        ap.add_argument("--socket", default=DEFAULT_SOCKET, help="the daemon's Unix socket "
                                                                 "(default %(default)s)")
        path = ap.parse_args(rest).socket
        try:
            reply = status(path)
        except OSError as e:
            return cli.fail(ap.prog,
                            f"--socket {path}: no daemon answers there ({e.strerror or e})")
        print(json.dumps(reply, indent=1))
        return 0
    from spina import cli
    return cli.fail("python -m host_agent",
                    f"unknown command {cmd!r} (choose from daemon, launch, status; --help)")


if __name__ == "__main__":
    sys.exit(main())
