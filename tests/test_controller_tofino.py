"""The controller's Tofino target without a Tofino: the fake P4Runtime switch of
tests/test_controller.py records what a deploy to a `target: tofino` switch pushes (the device
config bytes in each format, built from a small fake bf-p4c output directory) and which
register entries a job's clear writes (the TNA program's empty values and slot_rank_round).
Where bf-p4c is on PATH, also the loader on a real bf-p4c output directory.

Run just this file: python -m pytest tests/test_controller_tofino.py
"""
from __future__ import annotations

import json
import pathlib
import shutil
import struct
import subprocess
import sys

import grpc
import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from p4.v1 import p4runtime_pb2 as pb

from controller import model, state as state_mod, tofino
from controller.controller import Controller
from controller.p4rt import Connection, P4RuntimeError
from controller.pipeline import cookie_of, load_pipeline
from controller.registers import TofinoRegisters
from spina import spec, wire
from spina.config import ConfigError
from tests.test_controller import FakeSwitch
from tests.test_tna_agreement import _canonical

ROOT = pathlib.Path(__file__).resolve().parents[1]
STD_P4INFO = ROOT / "tofino" / "build" / "spina_tna.std.p4info.txtpb"
EXTERN_P4INFO = ROOT / "tofino" / "build" / "spina_tna.p4info.txtpb"

BINARY = bytes(range(256)) * 3 + b"\x00tail"  # every byte value, and a length over 127
CONTEXT = b'{"program_name": "spina_tna", "tables": []}'
BFRT = b'{"schema_version": "1.0.0", "tables": []}'


def fake_bf_p4c_output(d: pathlib.Path, pipes=("pipe",)) -> pathlib.Path:
    """What bf-p4c -o d writes for spina_tna.p4, reduced to the files the loader reads."""
    programs = [{"program_name": "spina_tna.p4", "p4_version": "p4-16", "pipes": [
        {"pipe_id": i, "pipe_name": p, "files": {"context": {"path": f"{p}/context.json"}}}
        for i, p in enumerate(pipes)]}]
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({"target": "tofino", "programs": programs}))
    (d / "bfrt.json").write_bytes(BFRT)
    for i, p in enumerate(pipes):
        (d / p).mkdir()
        (d / p / "context.json").write_bytes(CONTEXT + str(i).encode())
        (d / p / "tofino.bin").write_bytes(BINARY + str(i).encode())
    return d


def bf_pipeline_config_class():
    """stratum.hal.barefoot.BfPipelineConfig and its Profile from a descriptor built here
    (field numbers from stratum/hal/lib/barefoot/bf.proto): protobuf's own encoder and
    decoder, to hold the controller's hand encoding against."""
    f = descriptor_pb2.FileDescriptorProto(name="test_bf.proto", package="stratum.hal.barefoot",
                                           syntax="proto3")
    m = f.message_type.add(name="BfPipelineConfig")
    p = m.nested_type.add(name="Profile")
    T = descriptor_pb2.FieldDescriptorProto
    for name, num, typ, label in (("profile_name", 1, T.TYPE_STRING, T.LABEL_OPTIONAL),
                                  ("context", 2, T.TYPE_BYTES, T.LABEL_OPTIONAL),
                                  ("binary", 3, T.TYPE_BYTES, T.LABEL_OPTIONAL),
                                  ("pipe_scope", 4, T.TYPE_UINT32, T.LABEL_REPEATED)):
        p.field.add(name=name, number=num, type=typ, label=label)
    m.field.add(name="p4_name", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    m.field.add(name="bfruntime_info", number=2, type=T.TYPE_BYTES, label=T.LABEL_OPTIONAL)
    m.field.add(name="profiles", number=3, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                type_name=".stratum.hal.barefoot.BfPipelineConfig.Profile")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    return tuple(factory.GetPrototype(pool.FindMessageTypeByName(f"stratum.hal.barefoot.{n}"))
                 for n in ("BfPipelineConfig", "BfPipelineConfig.Profile"))


def tofino_doc(address: str, p4info: pathlib.Path, build: pathlib.Path, fmt="stratum",
               jobs=()) -> dict:
    return {"switches": [{"name": "s1", "target": "tofino", "grpc": address,
                          "address": "10.0.0.100", "ports": [1, 2, 3, 4],
                          "p4info": str(p4info), "device_config": str(build),
                          "device_config_format": fmt}],
            "workers": [{"name": f"w{i}", "ip": f"10.0.0.{i + 1}", "udp_port": 50000 + i,
                         "switch_port": i + 1, "mac": f"02:00:00:00:00:0{i + 1}"}
                        for i in range(4)],
            "jobs": list(jobs), "agents_dir": "agents"}


JOB7 = {"id": 7, "members": ["w0", "w1", "w2"], "nslots": 2, "slot_base": 4,
        "block_size": spec.TNA_SIZES["BLOCK_SIZE"], "nlanes": 1}


@pytest.fixture
def tna_p4info(tmp_path) -> pathlib.Path:
    """The TNA program's declared pipeline (spec.tna_p4info) as a P4Info text file."""
    p = tmp_path / "spina_tna.p4info.txtpb"
    p.write_text(text_format.MessageToString(spec.tna_p4info()))
    return p


def write_state(tmp_path, doc) -> model.DesiredState:
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc))
    return state_mod.load(p)


def ids(info, kind):
    return {o.preamble.name: o.preamble.id for o in getattr(info, kind)}


# ---------------------------------------------------------------- the device config
def pushed_pipeline(fake, tmp_path, p4info, fmt):
    """Deploy a job-less state to a fresh fake switch; the one SetForwardingPipelineConfig."""
    sw = fake()
    build = fake_bf_p4c_output(tmp_path / "out")
    with Controller(write_state(tmp_path, tofino_doc(sw.address, p4info, build, fmt))) as c:
        c.deploy()
    (req,) = sw.calls("SetForwardingPipelineConfig")
    return req


def test_deploy_pushes_the_stratum_bf_pipeline_config(fake, tmp_path, tna_p4info):
    """format stratum: the pushed p4_device_config is exactly protobuf's serialization of the
    BfPipelineConfig holding the fake build's files (one profile `pipe` on pipes 0..3)."""
    req = pushed_pipeline(fake, tmp_path, tna_p4info, "stratum")
    Config, Profile = bf_pipeline_config_class()
    want = Config(p4_name="spina_tna", bfruntime_info=BFRT, profiles=[Profile(
        profile_name="pipe", context=CONTEXT + b"0", binary=BINARY + b"0",
        pipe_scope=[0, 1, 2, 3])])
    assert req.config.p4_device_config == want.SerializeToString(deterministic=True)
    assert req.config.p4info == spec.tna_p4info()
    assert req.config.cookie.cookie == cookie_of(spec.tna_p4info(), req.config.p4_device_config)
    assert req.action == pb.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT


def test_deploy_pushes_the_bf_switchd_concatenation(fake, tmp_path, tna_p4info):
    """format bf_switchd: name, tofino.bin, context.json, each after its uint32 LE length."""
    req = pushed_pipeline(fake, tmp_path, tna_p4info, "bf_switchd")
    binary, context = BINARY + b"0", CONTEXT + b"0"
    assert len(binary) == 774 and len(context) == 44
    assert req.config.p4_device_config == (b"\x09\x00\x00\x00spina_tna"
                                           + b"\x06\x03\x00\x00" + binary
                                           + b"\x2c\x00\x00\x00" + context)


def test_two_profiles_share_the_pipes_and_bf_switchd_refuses_them(tmp_path):
    """Two pipe profiles: pipes 0, 2 and 1, 3 (the compiler's p4c-gen-bfrt-conf rule); the
    bf_switchd format holds one profile and says so."""
    build = fake_bf_p4c_output(tmp_path / "out", pipes=("ingress_a", "ingress_b"))
    Config, Profile = bf_pipeline_config_class()
    got = Config.FromString(tofino.device_config(build, "stratum"))
    assert [(p.profile_name, list(p.pipe_scope), p.binary[-1:]) for p in got.profiles] == \
        [("ingress_a", [0, 2], b"0"), ("ingress_b", [1, 3], b"1")]
    with pytest.raises(ConfigError, match="^2 pipe profiles: the bf_switchd format holds one"):
        tofino.device_config(build, "bf_switchd")


def test_empty_fields_encode_as_protobuf_does(tmp_path):
    """Edge cases of the hand encoding: empty bytes fields and an empty profile."""
    Config, Profile = bf_pipeline_config_class()
    build = tofino.TofinoBuild("", b"", (tofino.Profile("", b"", b"", ()),
                                         tofino.Profile("p", b"", b"\x01", (300,))))
    want = Config(profiles=[Profile(), Profile(profile_name="p", binary=b"\x01",
                                                             pipe_scope=[300])])
    assert tofino.stratum_config(build) == want.SerializeToString(deterministic=True)


# ---------------------------------------------------------------- registers
@pytest.mark.parametrize("which", ["spec", "bf-p4c"])
def test_reset_writes_the_tna_empty_values(fake, tmp_path, tna_p4info, which):
    """`reset` of job 7 (slots 4..5: copies 8..11) writes every slot register's copies 8..11,
    FLAG_LAST (4) in slot_flags and 0 elsewhere at the P4Info's widths, and slot_rank_round's
    cells 256..383 (copy * 32 + rank), then zeroes the job's counters at index 7. With
    spec's TNA P4Info and with bf-p4c's (tofino/build/spina_tna.std.p4info.txtpb: its names
    and IDs)."""
    sw = fake()
    build = fake_bf_p4c_output(tmp_path / "out")
    p4info = tna_p4info if which == "spec" else STD_P4INFO
    st = write_state(tmp_path, tofino_doc(sw.address, p4info, build, jobs=[JOB7]))
    with Controller(st) as c:
        c.deploy()
        assert isinstance(c.session("s1").registers, TofinoRegisters)
        before = len(sw.calls("Write"))
        c.reset([7])
    regs_w, counters_w = sw.calls("Write")[before:]
    info = sw.config.p4info
    if which == "bf-p4c":
        assert ids(info, "registers") != ids(spec.tna_p4info(), "registers")  # its own IDs
    rid = ids(info, "registers")
    got = {}
    for u in regs_w.updates:
        assert u.type == pb.Update.MODIFY
        r = u.entity.register_entry
        got[(r.register_id, r.index.index)] = (
            r.data.bitstring if r.data.HasField("bitstring")
            else tuple(m.bitstring for m in r.data.struct.members))  # a pair: lo, hi
    assert len(got) == len(regs_w.updates)  # no cell twice
    slot_registers = [n for n, _, cells in spec.tna_registers() if cells == 512]
    pairs = spec.tna_pair_registers()
    npairs = len(spec.tna_pair_registers())
    assert len(slot_registers) == 9 + npairs and f"slot_values_l0_p{npairs - 1}" in slot_registers
    want = {(rid[n], i): b"\x04" if n == "slot_flags" else
            (b"\x00", b"\x00") if n in pairs else b"\x00"
            for n in slot_registers for i in range(8, 12)}
    want.update({(rid["slot_rank_round"], i): b"\x00" for i in range(256, 384)})
    assert got == want
    assert wire.FLAG_LAST == spec.TNA_FLAGS_INVERTED == 4
    assert rid["job_loss_credit"] not in {k for k, _ in got}  # per job, not per slot
    cid = ids(info, "counters")
    assert [(u.entity.counter_entry.counter_id, u.entity.counter_entry.index.index,
             u.entity.counter_entry.data.packet_count) for u in counters_w.updates] == \
        [(cid[n], 7, 0) for n in spec.JOB_COUNTERS if n not in spec.TNA_LACKS]


def test_job_removal_clears_its_slots_after_the_deletes(fake, tmp_path, tna_p4info):
    """Removing job 7 deletes its entries, then clears copies 8..11 and rank cells
    256..383 in one Write (nothing else)."""
    sw = fake()
    build = fake_bf_p4c_output(tmp_path / "out")
    st = write_state(tmp_path, tofino_doc(sw.address, tna_p4info, build, jobs=[JOB7]))
    with Controller(st) as c:
        c.deploy()
        before = len(sw.calls("Write"))
        c.set_state(st.without_job(7))
    deletes, clear = sw.calls("Write")[before:]
    assert {u.type for u in deletes.updates} == {pb.Update.DELETE}
    rank = ids(spec.tna_p4info(), "registers")["slot_rank_round"]
    cells = sorted(u.entity.register_entry.index.index for u in clear.updates
                   if u.entity.register_entry.register_id == rank)
    assert cells == list(range(256, 384))
    assert len(clear.updates) == (9 + len(spec.tna_pair_registers())) * 4 + 128


class RegisterFake(FakeSwitch):
    """The fake switch, also keeping register cells (so reads see writes); `unimplemented`
    answers register writes as the PI-based servers do."""

    def __init__(self, unimplemented: bool = False):
        super().__init__()
        self.cells: dict[tuple[int, int], bytes] = {}
        self.unimplemented = unimplemented

    def Write(self, request, context):
        regs = [u.entity.register_entry for u in request.updates
                if u.entity.HasField("register_entry")]
        if regs and self.unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Register writes are not supported yet")
        for r in regs:
            self.cells[(r.register_id, r.index.index)] = r.data.bitstring
        return super().Write(request, context)

    def Read(self, request, context):
        regs = [q.register_entry for q in request.entities if q.HasField("register_entry")]
        if not regs:
            yield from super().Read(request, context)
            return
        out = pb.ReadResponse()
        for q in regs:
            e = out.entities.add()
            e.register_entry.CopyFrom(q)
            e.register_entry.data.bitstring = self.cells.get((q.register_id, q.index.index),
                                                             b"\x00")
        yield out


@pytest.fixture
def register_fake(grpc_servers):
    from p4.v1 import p4runtime_pb2_grpc
    return lambda **kw: grpc_servers(RegisterFake(**kw),
                                     p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server)


def test_only_registers_the_p4info_declares_are_written(register_fake):
    """A name the switch's P4Info lacks (head_round: p4src has it, the TNA program does not)
    is not written; slot_rank_round comes with every clear; reads see the empty values."""
    sw = register_fake()
    info = spec.tna_p4info()
    with Connection(sw.address) as conn:
        conn.set_pipeline(info, b"", 1)
        regs = TofinoRegisters(conn)
        regs.clear(["slot_round", "head_round", "slot_flags"], 8, 1)
        rid = ids(info, "registers")
        assert set(sw.cells) == {(rid["slot_round"], 8), (rid["slot_flags"], 8)} | \
            {(rid["slot_rank_round"], i) for i in range(256, 288)}
        assert regs.read("slot_flags", 8) == wire.FLAG_LAST
        assert regs.read("slot_rank_round", 287) == 0
        regs.reset(["slot_flags", "head_round"])
    (_, wipe) = sw.calls("Write")
    assert [(u.entity.register_entry.register_id, u.entity.register_entry.HasField("index"),
             u.entity.register_entry.data.bitstring) for u in wipe.updates] == \
        [(rid["slot_flags"], False, b"\x04"), (rid["slot_rank_round"], False, b"\x00")]


def test_a_server_without_register_writes_answers_one_line(register_fake):
    """The SDE's PI server (like simple_switch_grpc) answers UNIMPLEMENTED: one line saying
    which servers write registers."""
    sw = register_fake(unimplemented=True)
    with Connection(sw.address) as conn:
        conn.set_pipeline(spec.tna_p4info(), b"", 1)
        with pytest.raises(P4RuntimeError) as e:
            TofinoRegisters(conn).clear(["slot_round"], 0, 2)
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert "\n" not in str(e.value)
    assert str(e.value).endswith("this P4Runtime server does not write registers (the SDE's "
                                 "bf_switchd PI server does not; Stratum does)")


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("edit,field,msg", [
    (lambda s: s.update(device_config_format="tofino-pi"), "switches[0].device_config_format",
     "must be one of stratum, bf_switchd"),
    (lambda s: s.pop("device_config_format"), "switches[0].device_config_format",
     "must be one of stratum, bf_switchd"),
    (lambda s: s.pop("device_config"), "switches[0].device_config", "required for target"),
    (lambda s: s.update(target="bmv2"), "switches[0].device_config_format",
     "only for target tofino"),
])
def test_switch_fields_are_validated(tmp_path, edit, field, msg):
    doc = tofino_doc("127.0.0.1:1", tmp_path / "p4info.txtpb", tmp_path / "out")
    edit(doc["switches"][0])
    with pytest.raises(ConfigError) as e:
        state_mod.parse(doc)
    assert str(e.value).startswith(f"{field}: {msg}") and "\n" not in str(e.value)


def test_tofino_jobs_use_the_tna_sizes(tmp_path):
    doc = tofino_doc("127.0.0.1:1", tmp_path / "p4info.txtpb", tmp_path / "out",
                     jobs=[dict(JOB7, block_size=32)])
    with pytest.raises(ConfigError, match=r"^jobs\[0\]\.block_size: the tofino P4 program "
                                          rf"aggregates blocks of {spec.TNA_SIZES['BLOCK_SIZE']}$"):
        state_mod.parse(doc)


@pytest.mark.parametrize("missing", ["pipe/tofino.bin", "pipe/context.json", "bfrt.json",
                                     "manifest.json", "."])
def test_a_missing_file_is_named(tmp_path, tna_p4info, missing):
    build = fake_bf_p4c_output(tmp_path / "out")
    gone = build / missing
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    st = write_state(tmp_path, tofino_doc("127.0.0.1:1", tna_p4info, build))
    with pytest.raises(ConfigError) as e:
        load_pipeline(st, st.switches["s1"])
    text = str(e.value)
    assert "\n" not in text
    if missing == ".":
        assert text.startswith(f"switch s1: field 'device_config': {build.resolve()} does not "
                               "exist")
    else:
        assert text.startswith(f"switch s1: field 'device_config': {build / missing} does not "
                               "exist (")


def test_the_sdes_bf_rt_json_name_is_accepted(tmp_path):
    build = fake_bf_p4c_output(tmp_path / "out")
    (build / "bfrt.json").rename(build / "bf-rt.json")
    assert tofino.load_build(build).bfrt == BFRT


def test_a_p4info_with_tofino_externs_is_refused(tmp_path):
    """The committed tofino/build/spina_tna.p4info.txtpb (Tofino-specific externs) is not what
    a P4Runtime server takes: one line naming the flag."""
    build = fake_bf_p4c_output(tmp_path / "out")
    st = write_state(tmp_path, tofino_doc("127.0.0.1:1", EXTERN_P4INFO, build))
    with pytest.raises(ConfigError) as e:
        load_pipeline(st, st.switches["s1"])
    assert str(e.value).startswith(f"switch s1: field 'p4info': {EXTERN_P4INFO}: not a P4Info")
    assert str(e.value).endswith("compile with bf-p4c --p4runtime-force-std-externs")
    assert "\n" not in str(e.value)


def test_cli_bad_format_exits_2_with_one_line(tmp_path):
    doc = tofino_doc("127.0.0.1:1", tmp_path / "p4info.txtpb", tmp_path / "out", fmt="pi")
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "controller", "-c", str(p), "deploy"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "switches[0].device_config_format" in out.stderr
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------- bf-p4c's own files
def test_committed_std_p4info_names_the_tna_registers():
    """tofino/build/spina_tna.std.p4info.txtpb (make tofino, --p4runtime-force-std-externs)
    declares spec's TNA registers and counters as standard P4Runtime entities, which the
    controller finds by name (tables too)."""
    info = text_format.Parse(STD_P4INFO.read_text(), spec.tna_p4info().__class__(),
                             allow_unknown_field=True)
    assert sorted((r.preamble.name, spec.p4info_register_width(info, r), r.size)
                  for r in info.registers) == sorted(spec.tna_registers())
    assert {c.preamble.name: c.size for c in info.counters} == spec.TNA_COUNTERS
    assert {t.preamble.name for t in info.tables} == set(spec.TNA_TABLES)
    assert [x.extern_type_name for x in info.externs] == ["PortMetadata"]
    # Issue 28 item 2: this program has neither the fabric roles nor the hold of a newer round
    # (tofino/README.md, "What each target supports"), which the controller reads here.
    assert not tofino.has_roles(info) and not tofino.has_hold(info)


def test_real_bf_p4c_output(tmp_path):
    """Where bf-p4c is on PATH: compile tofino/ with standard externs; the loader reads its
    output (program spina_tna, one profile `pipe` on pipes 0..3, the files' bytes) in both
    formats, and the P4Info is the committed one (contents, not order)."""
    if shutil.which("bf-p4c") is None:
        pytest.skip("bf-p4c not on PATH: its output directory cannot be made here")
    out, info = tmp_path / "out", tmp_path / "std.p4info.txtpb"
    subprocess.run(["bf-p4c", "--target", "tofino", "--arch", "tna", "-o", str(out),
                    "--p4runtime-force-std-externs", "--p4runtime-files", str(info),
                    str(ROOT / "tofino" / "spina_tna.p4")], check=True, capture_output=True)
    assert _canonical(info.read_text()) == _canonical(STD_P4INFO.read_text())
    binary, context = (out / "pipe" / "tofino.bin").read_bytes(), \
        (out / "pipe" / "context.json").read_bytes()
    Config, Profile = bf_pipeline_config_class()
    got = Config.FromString(tofino.device_config(out, "stratum"))
    assert (got.p4_name, got.bfruntime_info) == ("spina_tna", (out / "bfrt.json").read_bytes())
    assert [(p.profile_name, list(p.pipe_scope), p.binary, p.context) for p in got.profiles] \
        == [("pipe", [0, 1, 2, 3], binary, context)]
    pi = tofino.device_config(out, "bf_switchd")
    assert pi == b"".join(struct.pack("<I", len(x)) + x
                          for x in (b"spina_tna", binary, context))


def test_the_example_desired_state_loads():
    """controller/examples/tofino.yaml (make deploy TARGET=tofino) is a valid desired state."""
    st = state_mod.load(ROOT / "controller" / "examples" / "tofino.yaml")
    sw = st.switches["s1"]
    assert (sw.target, sw.device_config_format) == ("tofino", "stratum")
    assert st.resolve(sw.p4info).resolve() == STD_P4INFO
    assert (st.jobs[1].block_size, st.jobs[1].nlanes) == (spec.TNA_SIZES["BLOCK_SIZE"], 1)


# ---------------------------------------------------------------- lane widths
@pytest.mark.parametrize("edit,field,msg", [
    (lambda s: s.update(lane_bits=12), "switches[0].lane_bits", "must be one of 32, 16, 8"),
    (lambda s: s.update(lane_bits="16"), "switches[0].lane_bits", "must be one of 32, 16, 8"),
    (lambda s: (s.pop("device_config_format"), s.update(target="bmv2", lane_bits=16)),
     "switches[0].lane_bits", "only for target tofino"),
])
def test_the_switch_lane_width_is_validated(tmp_path, edit, field, msg):
    test_switch_fields_are_validated(tmp_path, edit, field, msg)


@pytest.mark.parametrize("switch_bits,job_bits", [(32, 16), (32, 8), (16, 32), (16, 8), (8, 16)])
def test_a_job_of_another_lane_width_is_refused(tmp_path, switch_bits, job_bits):
    """One TNA program serves one lane width (tofino/size.p4 SPINA_LANE_BITS): a job of another
    is refused naming its lane_bits and why; a job of the switch's width is taken."""
    doc = tofino_doc("127.0.0.1:1", tmp_path / "p4info.txtpb", tmp_path / "out",
                     jobs=[dict(JOB7, lane_bits=job_bits)])
    doc["switches"][0]["lane_bits"] = switch_bits
    with pytest.raises(ConfigError) as e:
        state_mod.parse(doc)
    assert str(e.value) == (
        f"jobs[0].lane_bits: {job_bits}-bit lanes on switch 's1', whose TNA program serves "
        f"{switch_bits}-bit lanes only (its lane_bits; one program holds one width and takes a "
        "packet of another as malformed: tofino/README.md, 'Narrow lanes')")
    doc["jobs"][0]["lane_bits"] = switch_bits
    assert state_mod.parse(doc).jobs[7].lane_bits == switch_bits


def _narrow_info(bits: int):
    """spec's TNA P4Info with pair_t's halves int<bits>, as bf-p4c -DSPINA_LANE_BITS=bits
    declares them."""
    info = spec.tna_p4info()
    for m in info.type_info.structs[spec.TNA_PAIR_TYPE].members:
        m.type_spec.bitstring.int.bitwidth = bits  # the oneof: bit -> int
    return info


def _narrow_p4info(tmp_path, bits: int) -> pathlib.Path:
    p = tmp_path / f"spina_tna{bits}.p4info.txtpb"
    p.write_text(text_format.MessageToString(_narrow_info(bits)))
    return p


def test_the_p4info_must_be_compiled_for_the_switch_lane_width(tmp_path, tna_p4info):
    """Where the switch's lane_bits meets the program: the P4Info's pair registers' halves."""
    build = fake_bf_p4c_output(tmp_path / "out")
    for p4info, bits, compiled in ((tna_p4info, 16, 32), (_narrow_p4info(tmp_path, 16), 32, 16),
                                   (_narrow_p4info(tmp_path, 8), 16, 8)):
        doc = tofino_doc("127.0.0.1:1", p4info, build)
        doc["switches"][0]["lane_bits"] = bits
        st = write_state(tmp_path, doc)
        with pytest.raises(ConfigError) as e:
            load_pipeline(st, st.switches["s1"])
        assert str(e.value) == (
            f"switch s1: field 'lane_bits': {bits}, but {p4info} is the TNA program compiled "
            f"for {compiled}-bit lanes (its pair registers' halves; tofino/size.p4 "
            "SPINA_LANE_BITS)")
    doc["switches"][0]["lane_bits"] = 8
    st = write_state(tmp_path, doc)
    info, _ = load_pipeline(st, st.switches["s1"])
    assert tofino.lane_bits(info) == 8


def test_a_narrow_program_pair_registers_are_cleared_at_their_width(register_fake):
    """A 16-bit program's pair_t halves are int<16>: a slot clear writes both as 16-bit zeros."""
    sw = register_fake()
    info = _narrow_info(16)
    with Connection(sw.address) as conn:
        conn.set_pipeline(info, b"", 1)
        TofinoRegisters(conn).clear(["slot_values_l0_p0"], 0, 1)
    (req,) = sw.calls("Write")
    pair_id = ids(info, "registers")["slot_values_l0_p0"]
    (update,) = [u for u in req.updates if u.entity.register_entry.register_id == pair_id]
    members = update.entity.register_entry.data.struct.members
    assert [m.bitstring for m in members] == [b"\x00", b"\x00"]


def test_a_bounded_loss_job_needs_a_program_with_the_hold(tmp_path, tna_p4info):
    """Issue 28 item 2: without the hold of a newer round a flush could strand a worker whose
    result was lost (docs/reliability.md). A bounded-loss job on a tofino switch whose P4Info
    declares no head_round register is refused naming the job, the field, the file and why;
    an exact job on it is taken, and so is the bounded-loss job on the Tofino 2 profile, whose
    committed P4Info declares head_round (include/hold.p4)."""
    build = fake_bf_p4c_output(tmp_path / "out")
    lossy = dict(JOB7, bounded_loss=0.01, loss_deadline=0.01)
    st = write_state(tmp_path, tofino_doc("127.0.0.1:1", tna_p4info, build, jobs=[lossy]))
    with pytest.raises(ConfigError) as e:
        load_pipeline(st, st.switches["s1"])
    assert str(e.value) == (
        f"job 7: field 'bounded_loss': 0.01, but switch s1's TNA program ({tna_p4info}) has no "
        f"hold of a newer round (no head_round register): {tofino.NO_HOLD}")
    st = write_state(tmp_path, tofino_doc("127.0.0.1:1", tna_p4info, build, jobs=[JOB7]))
    info, _ = load_pipeline(st, st.switches["s1"])
    assert not tofino.has_hold(info)
    with_hold = ROOT / "tofino/build/spina_t2na_roles.std.p4info.txtpb"
    st = write_state(tmp_path, tofino_doc("127.0.0.1:1", with_hold, build, jobs=[lossy]))
    info, _ = load_pipeline(st, st.switches["s1"])
    assert tofino.has_hold(info)


def test_the_leaf_rows_are_written_with_the_profile_s_parameters(tmp_path):
    """Issue 46 item 3: on the Tofino 2 profile (its committed P4Info) FabricRoles writes the
    plan's as_leaf row (p4src's rack, nlocal, epoch, mcast_grp) with the parameters that
    P4Info declares, in its order: rack, rack_bit, all_local, epoch; as_spine takes none. A
    program whose as_leaf takes a parameter the rows cannot give is refused in one line
    naming the switch, the action and the parameter."""
    from types import SimpleNamespace

    from controller.controls import FabricRoles
    from controller.p4rt import P4InfoIndex
    from spina import rows
    path = ROOT / "tofino/build/spina_t2na_roles.std.p4info.txtpb"
    info = text_format.Parse(path.read_text(), spec.tna_p4info().__class__())
    share = rows.SwitchRows(entries=[
        ("job_level", {"job": 7}, "as_leaf", {"rack": 3, "nlocal": 6, "epoch": 2,
                                              "mcast_grp": 8}),
        ("job_level", {"job": 9}, "as_spine", {})])
    sw = SimpleNamespace(name="s1")
    leaf, spine = FabricRoles(SimpleNamespace(index=P4InfoIndex(info))).job_entries(sw, share)
    (as_leaf,) = [a for a in info.actions if a.preamble.name == "as_leaf"]
    assert leaf.action.action.action_id == as_leaf.preamble.id
    assert [(p.param_id, int.from_bytes(p.value, "big")) for p in leaf.action.action.params] \
        == [(q.id, v) for q, v in zip(as_leaf.params, (3, 1 << 3, (1 << 6) - 1, 2))]
    assert [p.name for p in as_leaf.params] == ["rack", "rack_bit", "all_local", "epoch"]
    assert not spine.action.action.params
    as_leaf.params.add(id=9, name="spine_epoch", bitwidth=16)
    with pytest.raises(ConfigError) as e:
        FabricRoles(SimpleNamespace(index=P4InfoIndex(info))).job_entries(sw, share)
    assert str(e.value) == (
        "switches.s1.p4info: action 'as_leaf' takes parameter 'spine_epoch', which the rows "
        "(parameters rack, nlocal, epoch, mcast_grp) neither have nor derive")
