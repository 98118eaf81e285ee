"""The one validation toolkit: every file (job files, the daemon's, the parameter server's and
the compressors' configs, the controller's YAML, switch configs) and every protocol surface (the
daemon's requests) checks its fields with these, so that a bad value is refused the same way
everywhere: one ConfigError, `WHERE: WHAT`, naming the field. Command-line options have their
argparse types in spina/cli.py.

    need(cond, "jobs[1].nslots", "must be in 1..4096, got 0")  # "jobs[1].nslots: must be ..."
    need = checker("ps policy: ")
    need(cond, "staleness", "must be >= 0")            # "ps policy: field 'staleness': must ..."

A bool is never a number and a number never a string (JSON and YAML keep them apart; Python's
bool is an int); an integer is a number.
"""
from __future__ import annotations

import dataclasses
import json


class ConfigError(ValueError):
    """Bad configuration; the message names the offending field. `field` and `detail`, when
    set, are the field's name and what is wrong with it, so that a file's parser can name the
    field its own way (`jobs[0].nslots: ...`)."""

    def __init__(self, msg: str, field: str | None = None, detail: str | None = None):
        super().__init__(msg)
        self.field, self.detail = field, detail

    def at(self, where: str) -> "ConfigError":
        """This error named under `where` (e.g. "jobs[0]" -> "jobs[0].nslots: ...")."""
        if self.field is None:
            return ConfigError(f"{where}: {self}")
        return ConfigError(f"{where}.{self.field}: {self.detail}", f"{where}.{self.field}",
                           self.detail)


# ------------------------------------------------------------------ kinds of values
KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
              list: "a list", dict: "a mapping"}
_ANNOTATIONS = {"int": int, "float": float, "str": str, "bool": bool}


def is_kind(value, kind: type) -> bool:
    """`value` is of `kind` as a file means it: an int is a float, a bool is neither."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if kind is float else kind)


def kind_problem(value, kind: type) -> str | None:
    """`'x' is not an integer`, or None when `value` is of `kind`."""
    return None if is_kind(value, kind) else f"{value!r} is not {KIND_NAMES[kind]}"


# ------------------------------------------------------------------ raising
def need(cond, where: str, msg: str) -> None:
    """Raise ConfigError("WHERE: MSG") unless `cond`."""
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def checker(prefix: str):
    """`need(cond, field, msg)`: raise ConfigError("<prefix>field '<field>': <msg>") unless cond
    (prefix "" or ending in ": ")."""
    def need_field(cond, name: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{prefix}field '{name}': {msg}")
    return need_field


# ------------------------------------------------------------------ mappings of fields
def mapping(d, where: str, required: set, optional: set) -> dict:
    """`d` if it is a mapping with every `required` field and no field outside both sets."""
    need(isinstance(d, dict), where, "must be a mapping")
    unknown = set(d) - required - optional
    need(not unknown, f"{where}.{sorted(unknown)[0] if unknown else ''}",
         f"unknown field (known: {', '.join(sorted(required | optional))})")
    for k in sorted(required):
        need(k in d, f"{where}.{k}", "required field is missing")
    return d


def integer(d: dict, key: str, where: str, lo: int, hi: int, default=None) -> int:
    """d[key] (or `default`): an integer in lo..hi."""
    v = d.get(key, default)
    need(is_kind(v, int), f"{where}.{key}", kind_problem(v, int))
    need(lo <= v <= hi, f"{where}.{key}", f"must be in {lo}..{hi}, got {v}")
    return v


def number(d: dict, key: str, where: str, default: float) -> float:
    """d[key] (or `default`) as a float."""
    v = d.get(key, default)
    need(is_kind(v, float), f"{where}.{key}", kind_problem(v, float))
    return float(v)


def string(d: dict, key: str, where: str, default=None) -> str:
    """A non-empty string field (a name, a path): never a number, list or mapping."""
    v = d.get(key, default)
    need(isinstance(v, str) and v, f"{where}.{key}", f"must be a non-empty string, got {v!r}")
    return v


def optional_list(d: dict, key: str, where: str) -> list:
    """An optional list field ([] when absent or null)."""
    v = d.get(key) or []
    need(isinstance(v, list), f"{where}.{key}", kind_problem(v, list) or "")
    return v


def number_field(d: dict, key: str, kind: type, where: str = ""):
    """d[key] if it is an integer (kind int) or a number (kind float), as `kind`. `where`
    prefixes the field's name in the error (e.g. "workers[1].")."""
    problem = kind_problem(d[key], kind)
    if problem:
        raise ConfigError(f"field '{where}{key}': {problem}", f"{where}{key}", problem)
    return kind(d[key])


def dataclass_kwargs(cls, d, what: str) -> dict:
    """Keyword arguments for the dataclass `cls` from the mapping `d`: a key `cls` does not have
    or a value of the wrong type (by the field's annotation: bool, int, float, str, optionally
    `| None`) is a ConfigError naming `what` and the field. Floats given as integers become
    floats."""
    if not isinstance(d, dict):
        raise ConfigError(f"{what}: must be a mapping of field names to values")
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    out = {}
    for key, value in d.items():
        if key not in types:
            raise ConfigError(f"{what}: unknown field '{key}' (known: {', '.join(sorted(types))})")
        kinds = [t.strip() for t in types[key].split("|")]
        if value is None and "None" in kinds:
            out[key] = None
            continue
        kind = _ANNOTATIONS.get(kinds[0])
        problem = kind and kind_problem(value, kind)
        if problem:
            raise ConfigError(f"{what}: field '{key}': {problem}")
        out[key] = float(value) if kind is float else value
    return out


def read_json(path, what: str):
    """The JSON document in `path`; unreadable or not JSON is a ConfigError naming `what`
    ("job file", "daemon config", ...) and the path."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path}: not JSON ({e})") from None


def load_json(path, what: str, parse):
    """parse(the JSON document in `path`), its ConfigError prefixed with the path."""
    d = read_json(path, what)
    try:
        return parse(d)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
