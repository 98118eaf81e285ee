"""One log format for every SpINA process, chosen by `--log-format text|kv|json`.

    ap = cli.ArgumentParser(prog="python -m host_agent.launch")
    log.add_options(ap)                                  # --log-level, --log-format
    args = ap.parse_args(argv)
    log.setup("launch", args.log_level, args.log_format)

Every line carries ts (UTC, ms), level, proc (the process's role, from `setup`), pid, logger
and msg; lines about a call add job, call and rank as fields of their own:

    alog = log.bind(logging.getLogger("spina.agent"), job=lambda: agent.job.job, rank=0)
    alog.warning("ignoring malformed packet: %s", err, call=agent.call_id)

A bound value may be a callable (read when a line is written: the call id of the moment); a
keyword that is not one of logging's own (exc_info, stack_info, stacklevel, extra) becomes a
field of that line only. A plain logger takes fields too: `extra=log.fields(job=1, rank=0)`.

    text  2026-12-01 02:40:00.123 WARNING spina.daemon: call failed: ... job=1 call=7 rank=0
    kv    ts=2026-12-01T02:40:00.123Z level=warning proc=daemon pid=81 logger=spina.daemon
          msg="call failed: ..." job=1 call=7 rank=0            (one line)
    json  {"ts": "2026-12-01T02:40:00.123Z", "level": "warning", "proc": "daemon", ..., "job": 1}

`kv` is logfmt: a value with a space, `"`, `=`, `\\`, a control character or nothing in it is
double-quoted with `\\"`, `\\\\`, `\\n`, `\\r`, `\\t` escaped (other line breakers as `\\uXXXX`),
so every record (a traceback too, in the `exc` field) is one line in kv and json. `text`
(the default) is for people; kv and json are for grep and log shippers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys

from spina import cli

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "kv", "json")
DEFAULT_FORMAT = "text"
_FIELDS = "spina_fields"  # the LogRecord attribute that carries a line's bound fields
_CALL_FIELDS = {"job": 0, "epoch": 1, "call": 2, "rank": 3}  # first, in this order
_LOGGING_KWARGS = frozenset(("exc_info", "stack_info", "stacklevel", "extra"))


@cli.refuses("LOUD", "debug")
def log_level(text: str) -> str:
    """An argparse type (and the config files' check): a logging level name."""
    if text not in LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level "
                                         f"(one of {', '.join(LEVELS)})")
    return text


@cli.refuses("xml", "")
def log_format(text: str) -> str:
    """An argparse type (and the config files' check): one of FORMATS."""
    if text not in FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log format "
                                         f"(one of {', '.join(FORMATS)})")
    return text


def add_options(parser: argparse.ArgumentParser, level: str | None = "INFO",
                fmt: str | None = DEFAULT_FORMAT) -> None:
    """Add --log-level and --log-format to `parser`. A default of None leaves the option
    unset when not given (a config file's value then applies)."""
    shown = {None, argparse.SUPPRESS}  # no default to print
    parser.add_argument("--log-level", type=log_level, default=level, metavar="LEVEL",
                        help=f"one of {', '.join(LEVELS)}"
                             + (" (default %(default)s)" if level not in shown else ""))
    parser.add_argument("--log-format", type=log_format, default=fmt, metavar="FORMAT",
                        help="text (for people), kv (key=value, logfmt) or json (one object "
                             "a line)" + (" (default %(default)s)" if fmt not in shown else ""))


def verbosity(count: int, base: str = "WARNING") -> str:
    """The level `count` -v flags give from `base` (INFO, then DEBUG); for commands that keep
    -v beside --log-level: `args.log_level or verbosity(args.verbose)`."""
    return LEVELS[max(0, LEVELS.index(base) - count)]


class BoundLogger(logging.LoggerAdapter):
    """A logger whose lines carry fields (job, rank, ...), rendered as fields of their own.

    `log.info(msg, *args, call=7)` adds `call` to that line only; a callable field value is
    called when the line is written.
    """

    def process(self, msg, kwargs):
        fields = dict(self.extra)
        for key in [k for k in kwargs if k not in _LOGGING_KWARGS]:
            fields[key] = kwargs.pop(key)
        extra = dict(kwargs.get("extra") or {})
        extra[_FIELDS] = {**extra.get(_FIELDS, {}),
                          **{k: v() if callable(v) else v for k, v in fields.items()}}
        kwargs["extra"] = extra
        return msg, kwargs


def fields(**fields) -> dict:
    """`extra=` for a plain logger call: `log.debug("...", extra=fields(job=1, rank=0))`."""
    return {_FIELDS: fields}


def bind(logger: logging.Logger | BoundLogger, **fields) -> BoundLogger:
    """`logger` with `fields` on every line (binding a BoundLogger again adds to its fields)."""
    if isinstance(logger, BoundLogger):
        return BoundLogger(logger.logger, {**logger.extra, **fields})
    return BoundLogger(logger, fields)


def _ts(record: logging.LogRecord) -> str:
    t = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


_KV_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _kv_escape(c: str) -> str:
    """One character of a quoted logfmt value: the usual escapes, other characters that
    could end or split a line (controls, U+0085, U+2028/9) as \\uXXXX."""
    if c in _KV_ESCAPES:
        return _KV_ESCAPES[c]
    if c < " " or c in "\x7f\x85\u2028\u2029":
        return f"\\u{ord(c):04x}"
    return c


def _kv_value(v) -> str:
    s = v if isinstance(v, str) else json.dumps(v) if isinstance(v, (bool, type(None))) \
        else str(v)
    escaped = "".join(_kv_escape(c) for c in s)
    if s and escaped == s and " " not in s and "=" not in s:
        return s
    return '"' + escaped + '"'


class Formatter(logging.Formatter):
    """Renders a record as text, kv (logfmt) or json; see the module docstring."""

    def __init__(self, fmt: str = DEFAULT_FORMAT, proc: str = ""):
        super().__init__()
        self.kind, self.proc = log_format(fmt), proc

    def fields(self, record: logging.LogRecord) -> dict:
        """The line's fields in order: ts, level, proc, pid, logger, msg, the bound ones (job,
        epoch, call, rank first), exc. A bound field named like one of the first six gets a
        trailing `_` (pid_)."""
        out = {"ts": _ts(record), "level": record.levelname.lower(), "proc": self.proc,
               "pid": record.process, "logger": record.name, "msg": record.getMessage()}
        bound = getattr(record, _FIELDS, {})
        for k in sorted(bound, key=lambda k: _CALL_FIELDS.get(k, len(_CALL_FIELDS))):
            out[k + "_" if k in out else k] = bound[k]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return out

    def format(self, record: logging.LogRecord) -> str:
        f = self.fields(record)
        if self.kind == "json":
            return json.dumps(f, default=str)
        if self.kind == "kv":
            return " ".join(f"{k}={_kv_value(v)}" for k, v in f.items())
        extra = "".join(f" {k}={_kv_value(v)}" for k, v in f.items()
                        if k not in ("ts", "level", "proc", "pid", "logger", "msg", "exc"))
        line = (f"{f['ts'][:10]} {f['ts'][11:23]} {record.levelname} {record.name}: "
                f"{f['msg']}{extra}")
        return line + ("\n" + f["exc"] if "exc" in f else "")


def setup(proc: str, level: str | int = "INFO", fmt: str = DEFAULT_FORMAT,
          file: str | None = None) -> logging.Handler:
    """Send every logger's records at `level` and above to stderr (or `file`, appended) in
    `fmt`; a second call replaces the first one's handler (others, such as pytest's, stay).
    `proc` names the process in each line (switch, controller, daemon, launch, ps ...).
    Returns the handler."""
    handler = (logging.FileHandler(file) if file else logging.StreamHandler(sys.stderr))
    handler.setFormatter(Formatter(fmt, proc))
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h.formatter, Formatter):
            root.removeHandler(h)
            h.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def proc_name() -> str:
    """The role `setup` gave this process (switch, controller, daemon ...), '' before it."""
    for h in logging.getLogger().handlers:
        if isinstance(h.formatter, Formatter):
            return h.formatter.proc
    return ""


__all__ = ["BoundLogger", "DEFAULT_FORMAT", "FORMATS", "Formatter", "LEVELS", "add_options",
           "bind", "fields", "log_format", "log_level", "proc_name", "setup", "verbosity"]
