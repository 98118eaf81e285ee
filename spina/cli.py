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
import os
import socket
import sys

EXIT_BAD_INPUT = 2


def one_line(e) -> str:
    """`e`'s message on one line (YAML and some OS errors span several); an OSError without
    its `[Errno N]` prefix, naming its file if it has one."""
    if isinstance(e, OSError) and e.strerror:
        e = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
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


def refuses(*values: str):
    """Declare values an argparse type must refuse: tests/test_bad_input.py feeds each one to
    every option of every command whose type it is, so an option whose type declares none (a
    bare `int`, `float` or free text) fails that test instead of escaping it."""
    def mark(parse):
        parse.bad_values = values
        return parse
    return mark


def int_range(lo: int, hi: int | None = None, what: str = ""):
    """An argparse type: an integer in lo..hi (no upper bound when hi is None; `what` says
    what 0 or the bound means)."""
    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if hi is None and v < lo:
            raise argparse.ArgumentTypeError(f"{v} is less than {lo}{what}")
        if hi is not None and not lo <= v <= hi:
            top = f"2**{hi.bit_length()}-1" if hi > 1 << 32 and hi & (hi + 1) == 0 else hi
            raise argparse.ArgumentTypeError(f"{v} is not in {lo}..{top}{what}")
        return v
    parse.__name__ = "integer"  # argparse names the type in its own messages
    return refuses("x", str(lo - 1), *(() if hi is None else (str(hi + 1),)))(parse)


@refuses("x", "0", "65536")
def udp_port(text: str) -> int:
    """An argparse type: a UDP port 1..65535."""
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UDP port (1..65535)")
    return value


@refuses("x", "nan", "inf")
def finite(text: str) -> float:
    """An argparse type: any finite number."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


@refuses("x", "0", "-1", "nan")
def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    v = finite(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return v


@refuses("x", "-1", "inf")
def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (seconds, costs)."""
    v = finite(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number >= 0")
    return v


@refuses("x", "0", "-1", "2")
def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (a density, a ratio)."""
    v = finite(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1]")
    return v


@refuses("x", "-0.1", "1.5")
def unit_interval(text: str) -> float:
    """An argparse type: a number in [0, 1] (a loss rate, a bound where 0 means none)."""
    v = finite(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return v


def parsed_by(parse, name: str, bad: tuple[str, ...] = ()):
    """An argparse type from a parser that raises ValueError with its own message (a size,
    a rate): argparse then prints that message, naming the option. `bad`: values it refuses."""
    def parse_arg(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse_arg.__name__ = name
    return refuses(*bad)(parse_arg)


@refuses("soon", "0", "-1")
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


@refuses("no-such-host.invalid", "")
def ipv4_host(text: str) -> str:
    """An argparse type: an IPv4 address, or a name that resolves to one (returned as given)."""
    try:
        ipaddress.IPv4Address(text)
        return text
    except ValueError:
        pass
    try:
        if not text:
            raise OSError
        socket.getaddrinfo(text, None, socket.AF_INET)
    except (OSError, UnicodeError):
        raise argparse.ArgumentTypeError(f"{text!r} is neither an IPv4 address nor a name "
                                         "that resolves to one") from None
    return text


@refuses("no-such-file.json", ".")
def input_file(text: str) -> str:
    """An argparse type: a file that exists and can be read (checked before anything starts)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a directory, not a file" if os.path.isdir(text)
            else f"{text}: no such file")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return text


@refuses("no-such-file.json", ".")
def job_file(text: str) -> str:
    """An argparse type: a job or assignment file that exists. `{rank}` in its name stands for
    each process's $RANK (host_agent.assignment.agent_from_env's template: one setting for every
    torchrun node), so the file checked is this process's; without $RANK it is not checked."""
    if "{rank}" in text and "RANK" not in os.environ:
        return text
    input_file(text.replace("{rank}", os.environ.get("RANK", "")))
    return text


@refuses("no-such-path")
def existing_path(text: str) -> str:
    """An argparse type: a path that exists (a Unix socket, a directory, a file)."""
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory")
    return text


@refuses("no-such-dir/out.json", ".")
def output_file(text: str) -> str:
    """An argparse type: a file to write, in a directory that exists (the file need not)."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: directory {folder} does not exist")
    return text


@refuses("/dev/null/out")
def output_dir(text: str) -> str:
    """An argparse type: a folder to write into, made if missing: its nearest existing
    ancestor is a directory we may write in."""
    up = os.path.abspath(text)
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up) or not os.access(up, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot be made ({up} is not a directory "
                                         "we may write in)")
    return text


@refuses("", "two words", "a,b")
def name(text: str) -> str:
    """An argparse type: a name (of a switch, a worker): not empty, no space or comma."""
    if not text or any(c.isspace() or c == "," for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a name (no spaces or commas)")
    return text


def comma_list(parse, name: str):
    """An argparse type: a comma-separated list, each item parsed by the argparse type `parse`
    (spaces around items ignored; an empty list refused)."""
    def parse_list(text: str):
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} is an empty list")
        return [parse(t.strip()) for t in items]
    parse_list.__name__ = name
    return refuses("", ",", *getattr(parse, "bad_values", ()))(parse_list)


def names(choices=None):
    """An argparse type: a comma-separated list of names (of `choices` when given)."""
    def parse(text: str) -> list[str]:
        items = text.split(",")
        for item in items:
            name(item)
            if choices is not None and item not in choices:
                raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(choices)}")
        return items
    parse.__name__ = "names"
    return refuses("", "a,,b", *(() if choices is None else ("no-such-name",)))(parse)


METRICS_HOST = "127.0.0.1"  # a metrics endpoint's host when its address names none


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """'HOST:PORT', 'PORT' (loopback) or '[V6]:PORT' -> (host, port). A wildcard host is
    refused: the endpoint has no authentication, so it binds one chosen address."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = METRICS_HOST, text
    host = host.strip("[]") or METRICS_HOST
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {text!r}: expected [HOST:]PORT, e.g. 127.0.0.1:9100")
    try:
        wildcard = host != "localhost" and ipaddress.ip_address(host).is_unspecified
    except ValueError:
        raise ValueError(f"metrics address {text!r}: {host!r} is not an IP address") from None
    if wildcard:
        raise ValueError(f"metrics address {text!r}: a wildcard address would expose the "
                         f"metrics on every interface; give one address (default {METRICS_HOST})")
    return host, int(port)


@refuses("0.0.0.0:9100", "x", "127.0.0.1:70000")
def metrics_address(text: str) -> str:
    """An argparse type: a metrics endpoint, [HOST:]PORT (parse_address; a wildcard host is
    refused). Returns the text as given: the processes parse it again (spina.metrics)."""
    try:
        parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
