"""The Tofino device config: the `p4_device_config` bytes of SetForwardingPipelineConfig, built
from a bf-p4c output directory (`bf-p4c -o DIR`; `make tofino` leaves it in TNA_WORK).

bf-p4c writes, for a program `NAME.p4` compiled for Tofino 1:

    DIR/manifest.json          program name, target, and each pipe's name and context path
    DIR/bfrt.json              the BF Runtime schema (the SDE installs it as bf-rt.json)
    DIR/<pipe>/context.json    per pipe: the driver's view of the tables and registers
    DIR/<pipe>/tofino.bin      per pipe: the binary configuration of the stages

Two servers take these files, each in its own format (the switch's `device_config_format`):

- `stratum` (stratum_bf, stratum_bfrt): a serialized `stratum.hal.barefoot.BfPipelineConfig`
  (stratum/stratum, stratum/hal/lib/barefoot/bf.proto): p4_name = 1, bfruntime_info = 2,
  repeated Profile profiles = 3; Profile: profile_name = 1, context = 2, binary = 3, repeated
  uint32 pipe_scope = 4. Encoded by hand below (proto3 wire format, fields in number order,
  empty fields left out, pipe_scope packed, as protobuf itself serializes it): our
  dependencies carry no Stratum protos.
- `bf_switchd` (the SDE's PI-based P4Runtime server, `bf_switchd --p4rt-server`): the
  program name, tofino.bin and context.json, each preceded by its length as a 32-bit
  little-endian integer, one pipe only. Layout as in p4lang/p4runtime-shell
  config_builders/tofino.py and in Stratum's BfPipelineConfigToPiConfig
  (stratum/hal/lib/barefoot/bf_pipeline_utils.cc), which converts its own format to this one.

A third server, the SDE's BF Runtime gRPC server in bf_switchd (a switch's `api: bfrt`,
controller/bfrt.py), takes the files in its own `bfrt_proto.ForwardingPipelineConfig`
(bf-drivers src/bf_rt/proto/bfruntime.proto): p4_name = 1, bfruntime_info = 2, repeated
Profile profiles = 3, and Profile as above, field for field. Stratum's message was made after
it, so the `stratum` bytes are that message too (`bfrt_config`).

Pipe scope (Stratum, BF Runtime): every hardware pipe runs one of the program's profiles;
with n profiles on Tofino 1's 4 pipes, profile i gets pipes i, i + n, ... (as the compiler's
own p4c-gen-bfrt-conf assigns them: a 32Q folded system pairs pipes 0/2 and 1/3). Our program
has one profile, `pipe`, on pipes 0..3.

Not verified against a running bf_switchd or Stratum (no SDE here); the tests check the bytes
against the layouts above.
"""
from __future__ import annotations

import json
import pathlib
import struct
from dataclasses import dataclass

from spina import spec
from spina.config import ConfigError

PAIR_TYPE = spec.TNA_PAIR_TYPE

FORMATS = ("stratum", "bf_switchd")
TOFINO1_PIPES = 4
BFRT_NAMES = ("bfrt.json", "bf-rt.json")  # bf-p4c's name, the SDE's installed name

# What a TNA program has, read from its P4Info (tofino/README.md, "What each target supports"):
# the fabric roles are p4src's job_level and leaf_upstream tables (p4src/v1model/fabric.p4),
# the hold of a newer round needs head_round (spec.HEAD_REGISTERS). The Tofino 1 programs have
# neither, the Tofino 2 profile (tofino/spina_t2na_roles.p4) both; these say why, for the
# controller's refusals.
ROLE_TABLES = ("job_level", "leaf_upstream")
HOLD_REGISTER = "head_round"
NO_ROLES = ("not written for Tofino: a leaf stores its spine's result, a spine adopts a "
            "leaf's replay (tofino/README.md, 'The hold and the roles on Tofino 1')")
NO_HOLD = ("a flush could strand a worker whose result was lost (docs/reliability.md); on "
           "Tofino 1 the hold's update needs 3 comparisons in one stateful ALU, which has 2 "
           "(bf-p4c's message in tofino/README.md, 'The hold and the roles on Tofino 1'); "
           "the Tofino 2 profile tofino/spina_t2na_roles.p4 has it")


@dataclass(frozen=True)
class Profile:
    """One pipe profile of a compiled program: its context.json and binary."""
    name: str
    context: bytes
    binary: bytes
    pipe_scope: tuple[int, ...]


@dataclass(frozen=True)
class TofinoBuild:
    """What bf-p4c wrote for one program."""
    program: str
    bfrt: bytes
    profiles: tuple[Profile, ...]


def _read(path: pathlib.Path, why: str) -> bytes:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist ({why})")
    return path.read_bytes()


def load_build(directory) -> TofinoBuild:
    """The bf-p4c output in `directory`; ConfigError names the missing or bad file."""
    d = pathlib.Path(directory)
    if not d.is_dir():
        raise ConfigError(f"{d} is not a directory (bf-p4c -o DIR writes it; make tofino: "
                          "TNA_WORK, default /tmp/spina-tna-build)")
    manifest_path = d / "manifest.json"
    try:
        manifest = json.loads(_read(manifest_path, "bf-p4c writes it beside bfrt.json"))
        target = manifest["target"]
        (prog,) = manifest["programs"]
        program = prog["program_name"].removesuffix(".p4")
        pipes = [(p["pipe_name"], p["files"]["context"]["path"]) for p in prog["pipes"]]
    except ConfigError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{manifest_path}: not a bf-p4c manifest with one program "
                          f"({type(e).__name__}: {e})") from None
    if target != "tofino":
        raise ConfigError(f"{manifest_path}: target {target!r}: only Tofino 1 ('tofino') is "
                          "supported")
    if not pipes or len(pipes) > TOFINO1_PIPES:
        raise ConfigError(f"{manifest_path}: {len(pipes)} pipes; expected 1..{TOFINO1_PIPES}")
    bfrt_path = next((d / n for n in BFRT_NAMES if (d / n).is_file()), d / BFRT_NAMES[0])
    bfrt = _read(bfrt_path, "bf-p4c's BF Runtime schema")
    n = len(pipes)
    profiles = []
    for i, (name, context_rel) in enumerate(pipes):
        context_path = d / context_rel
        profiles.append(Profile(
            name=name, context=_read(context_path, f"pipe {name}'s context"),
            binary=_read(context_path.parent / f"{target}.bin", f"pipe {name}'s binary"),
            pipe_scope=tuple(x * n + i for x in range(TOFINO1_PIPES // n))))
    return TofinoBuild(program, bfrt, tuple(profiles))


# ---------------------------------------------------------------- protobuf wire format
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2); proto3 leaves an empty one out."""
    if not payload:
        return b""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def stratum_config(build: TofinoBuild) -> bytes:
    """The build as a serialized BfPipelineConfig (Stratum's format)."""
    out = _len_field(1, build.program.encode()) + _len_field(2, build.bfrt)
    for p in build.profiles:
        profile = (_len_field(1, p.name.encode()) + _len_field(2, p.context)
                   + _len_field(3, p.binary)
                   + _len_field(4, b"".join(_varint(s) for s in p.pipe_scope)))
        out += _varint(3 << 3 | 2) + _varint(len(profile)) + profile  # present even if empty
    return out


def bfrt_config(build: TofinoBuild) -> bytes:
    """The build as a serialized BF Runtime ForwardingPipelineConfig: the same fields and
    numbers as Stratum's BfPipelineConfig (module docstring)."""
    return stratum_config(build)


def bf_switchd_config(build: TofinoBuild) -> bytes:
    """The build as the SDE's PI server takes it: name, tofino.bin, context.json, each after
    its length (uint32, little-endian)."""
    if len(build.profiles) != 1:
        raise ConfigError(f"{len(build.profiles)} pipe profiles: the bf_switchd format holds "
                          "one (use device_config_format: stratum)")
    (p,) = build.profiles
    return b"".join(struct.pack("<I", len(part)) + part
                    for part in (build.program.encode(), p.binary, p.context))


def bitwidth(type_spec) -> int:
    """The width of a P4Info bitstring type (bit<W> or int<W>)."""
    bits = type_spec.bitstring
    return getattr(bits, bits.WhichOneof("type_spec")).bitwidth


def lane_bits(p4info) -> int | None:
    """The lane width the TNA program in `p4info` was compiled for (tofino/size.p4
    SPINA_LANE_BITS): its pair registers' halves, `pair_t.lo`; None without pair registers."""
    struct = p4info.type_info.structs.get(PAIR_TYPE)
    return None if struct is None else bitwidth(struct.members[0].type_spec)


ENCODERS = {"stratum": stratum_config, "bf_switchd": bf_switchd_config, "bfrt": bfrt_config}


def device_config(directory, fmt: str) -> bytes:
    """The bf-p4c output in `directory` encoded as `fmt`: a P4Runtime `p4_device_config`
    (FORMATS) or, for "bfrt", a BF Runtime ForwardingPipelineConfig."""
    if fmt not in ENCODERS:
        raise ConfigError(f"format {fmt!r}: must be one of {', '.join(FORMATS)}")
    return ENCODERS[fmt](load_build(directory))


def _declared(entities) -> set[str]:
    """The names of P4Info entities without their control prefix (bf-p4c's P4Info names
    them pipe.Control.name, its standard-externs P4Info by the @name given)."""
    return {e.preamble.name.rsplit(".", 1)[-1] for e in entities}


def has_roles(p4info) -> bool:
    """The TNA program in `p4info` has the fabric roles (ROLE_TABLES)."""
    return set(ROLE_TABLES) <= _declared(p4info.tables)


def has_hold(p4info) -> bool:
    """The TNA program in `p4info` has the hold of a newer round (HOLD_REGISTER)."""
    return HOLD_REGISTER in _declared(p4info.registers)
