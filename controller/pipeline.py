"""A switch's P4 program as files: its P4Info read (`read_p4info`), the pipeline a switch of the
desired state runs (`load_pipeline`: its files, or the software switch's spec) and the cookie
naming it (`cookie_of`), so `deploy` pushes a pipeline only when it changed. Every error names
the switch's field and the file.
"""
from __future__ import annotations

import hashlib
import pathlib

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from controller import tofino
from controller.model import DesiredState, Switch
from spina import spec
from spina.config import ConfigError


def read_p4info(path: pathlib.Path, target: str, where: str):
    """The P4Info in `path` (text, or binary for .bin / .pb); ConfigError naming `where` (e.g.
    "switch s1: field") and the file when it is missing or is not a P4Info."""
    if not path.exists():
        raise ConfigError(f"{where} 'p4info': {path} does not exist ({_built_by(target)})")
    info = p4info_pb2.P4Info()
    try:
        if path.suffix in (".bin", ".pb"):
            info.ParseFromString(path.read_bytes())
        else:
            text_format.Parse(path.read_text(), info, allow_unknown_field=True)
    except (text_format.ParseError, ValueError) as e:
        hint = (": a TNA P4Info with Tofino-specific externs does not parse here; compile "
                "with bf-p4c --p4runtime-force-std-externs" if target == "tofino" else "")
        raise ConfigError(f"{where} 'p4info': {path}: not a P4Info "
                          f"({str(e).splitlines()[0]}){hint}") from None
    return info


def _built_by(target: str) -> str:
    return ("make tofino writes the P4Info to tofino/build/ and bf-p4c's output directory to "
            "TNA_WORK/p4runtime" if target == "tofino" else
            "make p4 writes it where p4c-bm2-ss is installed")


def load_pipeline(state: DesiredState, sw: Switch):
    """(P4Info, device config bytes) for `sw`: its files, or the software switch's spec. A
    tofino switch's device config is built from bf-p4c's output directory
    (controller/tofino.py) in its `device_config_format`; its program must have what the
    switch's jobs need (a bounded-loss job: the hold of a newer round)."""
    if sw.p4info is None:
        return spec.p4info(), b""
    path = state.resolve(sw.p4info)
    where = f"switch {sw.name}: field"
    device_config = state.resolve(sw.device_config)
    for what, p in (("p4info", path), ("device_config", device_config)):
        if p is not None and not p.exists():
            raise ConfigError(f"{where} '{what}': {p} does not exist ({_built_by(sw.target)})")
    info = read_p4info(path, sw.target, where)
    if sw.target == "tofino":
        tofino_externs = sorted({x.extern_type_name for x in info.externs
                                 if x.extern_type_name in ("Register", "Counter")})
        if tofino_externs:
            raise ConfigError(f"{where} 'p4info': {path} declares {' and '.join(tofino_externs)}"
                              " as Tofino externs, which P4Runtime servers do not serve: "
                              "compile with bf-p4c --p4runtime-force-std-externs")
        compiled = tofino.lane_bits(info)
        if compiled is not None and compiled != sw.lane_bits:
            raise ConfigError(f"{where} 'lane_bits': {sw.lane_bits}, but {path} is the TNA "
                              f"program compiled for {compiled}-bit lanes (its pair registers' "
                              "halves; tofino/size.p4 SPINA_LANE_BITS)")
        for job in state.jobs_on(sw):
            if job.bounded_loss and not tofino.has_hold(info):
                raise ConfigError(
                    f"job {job.id}: field 'bounded_loss': {job.bounded_loss}, but switch "
                    f"{sw.name}'s TNA program ({path}) has no hold of a newer round (no "
                    f"{tofino.HOLD_REGISTER} register): {tofino.NO_HOLD}")
        try:
            fmt = sw.device_config_format if sw.api == "p4runtime" else "bfrt"
            cfg = tofino.device_config(device_config, fmt)
        except ConfigError as e:
            raise ConfigError(f"{where} 'device_config': {e}") from None
        return info, cfg
    cfg = device_config.read_bytes() if sw.device_config else b""
    return info, cfg


def cookie_of(p4info, device_config: bytes) -> int:
    """A 64-bit cookie naming a pipeline, so `deploy` pushes it only when it changed."""
    h = hashlib.sha256(p4info.SerializeToString(deterministic=True) + device_config).digest()
    return int.from_bytes(h[:8], "big") >> 1
