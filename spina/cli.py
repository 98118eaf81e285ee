"""What every command line shares: bad input is answered with exit status 2 and one line,
`PROG: error: MESSAGE`, naming the option, field or file (never a traceback, never usage).

    ap = cli.ArgumentParser(prog="python -m softswitch")
    ap.add_argument("--port", type=cli.int_range(0, 65535), ...)
    ...
    except (ConfigError, ValueError, OSError) as e:
        return cli.fail(ap.prog, e)
"""
from __future__ import annotations

import argparse
import ipaddress
import socket
import sys

EXIT_BAD_INPUT = 2


def one_line(e) -> str:
    """`e`'s message on one line (YAML and some OS errors span several)."""
    return " ".join(str(e).split())


def fail(prog: str, e) -> int:
    """Print `PROG: error: MESSAGE` on one line to stderr; returns the exit status (2)."""
    print(f"{prog}: error: {one_line(e)}", file=sys.stderr, flush=True)
    return EXIT_BAD_INPUT


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`PROG: error: argument --port: ...`) and exit
    status 2; `--help` still prints the usage. Subparsers inherit the class."""

    def error(self, message: str):
        sys.exit(fail(self.prog, message))


def int_range(lo: int, hi: int, what: str = ""):
    """An argparse type: an integer in lo..hi (`what` says what 0 or the bound means)."""
    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} outside {lo}..{hi}{what}")
        return v
    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def udp_port(text: str) -> int:
    """An argparse type: a UDP port 1..65535."""
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UDP port (1..65535)")
    return value


def _finite(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    v = _finite(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return v


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (seconds, costs)."""
    v = _finite(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number >= 0")
    return v


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (a density, a ratio)."""
    v = _finite(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1]")
    return v


def parsed_by(parse, name: str):
    """An argparse type from a parser that raises ValueError with its own message (a size,
    a rate): argparse then prints that message, naming the option."""
    def parse_arg(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse_arg.__name__ = name
    return parse_arg


def seconds_or_auto(text: str) -> float | str:
    """An argparse type for a loss deadline: 'auto' (spina.config.LOSS_DEADLINE_AUTO: from the
    measured round latency) or a finite number of seconds > 0."""
    if text == "auto":
        return text
    try:
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither seconds nor 'auto'") from None
    return positive_float(text)


def ipv4_host(text: str) -> str:
    """An argparse type: an IPv4 address, or a name that resolves to one (returned as given)."""
    try:
        ipaddress.IPv4Address(text)
        return text
    except ValueError:
        pass
    try:
        socket.getaddrinfo(text, None, socket.AF_INET)
    except (OSError, UnicodeError):
        raise argparse.ArgumentTypeError(f"{text!r} is neither an IPv4 address nor a name "
                                         "that resolves to one") from None
    return text
