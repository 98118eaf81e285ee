"""`spina capture FILE`: decode a capture's SpINA packets (spina/capture.py), the INA UDP ports
taken from --port, else from the desired state (-c FILE, or ./spina.yaml when it exists): every
switch's `udp_port`, else the default port."""
from __future__ import annotations

import os
import sys

from spina import cli, wire
from spina.capture import decode, parser as capture_parser
from spina.config import ConfigError

DEFAULT_STATE = "spina.yaml"  # the controller's default desired state (controller/__main__.py)


def parser(prog: str = "spina capture"):
    """spina.capture's arguments and -c."""
    ap = capture_parser(prog)
    ap.add_argument("-c", "--config", metavar="FILE", type=cli.input_file,
                    help="desired state whose switches' UDP ports are the INA ports (default: "
                         f"./{DEFAULT_STATE} if it exists; --port wins)")
    return ap


def main(argv=None, prog: str = "spina capture") -> int:
    args = parser(prog).parse_args(argv)
    ports = args.port
    if ports is None:
        path = args.config or (DEFAULT_STATE if os.path.exists(DEFAULT_STATE) else None)
        ports = [wire.DEFAULT_UDP_PORT]
        if path is not None:
            from controller.state import load
            try:
                state = load(path)
            except (ConfigError, OSError) as e:
                return cli.fail(prog, f"{path}: {e}")
            ports = sorted({sw.udp_port for sw in state.switches.values()})
            print(f"{prog}: INA ports {', '.join(map(str, ports))} (the switches of "
                  f"{path})", file=sys.stderr)
    return decode(args.file, ports, prog)


if __name__ == "__main__":
    sys.exit(main())
