"""`spina capture FILE`: decode a capture's SpINA packets (spina/capture.py), the INA UDP ports
taken from --port, else from the desired state (-c FILE, or ./spina.yaml when it exists): every
switch's `udp_port`, else the default port."""
from __future__ import annotations

import os
import sys

from spina import wire
from spina.capture import decode, parser
from spina.config import ConfigError

DEFAULT_STATE = "spina.yaml"  # the controller's default desired state (controller/__main__.py)


def main(argv=None) -> int:
    ap = parser(prog="spina capture")
    ap.add_argument("-c", "--config", metavar="FILE",
                    help="desired state whose switches' UDP ports are the INA ports (default: "
                         f"./{DEFAULT_STATE} if it exists; --port wins)")
    args = ap.parse_args(argv)
    ports = args.port
    if ports is None:
        path = args.config or (DEFAULT_STATE if os.path.exists(DEFAULT_STATE) else None)
        ports = [wire.DEFAULT_UDP_PORT]
        if path is not None:
            from controller.state import load
            try:
                state = load(path)
            except (ConfigError, OSError) as e:
                print(f"spina capture: error: {path}: {e}", file=sys.stderr)
                return 2
            ports = sorted({sw.udp_port for sw in state.switches.values()})
            print(f"spina capture: INA ports {', '.join(map(str, ports))} (the switches of "
                  f"{path})", file=sys.stderr)
    return decode(args.file, ports)


if __name__ == "__main__":
    sys.exit(main())
