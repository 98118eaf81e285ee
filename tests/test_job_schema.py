"""The one job schema (spina.config.JobConfig, issue 42): every field of the declaration, set to
a value other than its default, comes back unchanged from every writer and reader of jobs: the
YAML desired state (parsed and saved), `DesiredState.with_job`, `spina job add` (its flags and
the file it writes), the fabric plan's jobs, the controller's agent files, the software
switch's own files, and job files and assignments. A writer that drops or renames a field
fails here, naming it. The non-default values come from the declaration itself, so a new
option is walked without editing this file.

Run just this file: python -m pytest tests/test_job_schema.py
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from bench.scale_out import fabric_doc
from controller import __main__ as cli_main, plan, state as state_mod
from controller.controller import Controller
from controller.model import Job
from controller.softswitch_files import from_l2_config, from_udp_jobs
from spina.config import (
    JOB_DEFAULTS,
    JOB_FIELDS,
    JOB_OPTIONS,
    LOSS_DEADLINE_AUTO,
    Assignment,
    ConfigError,
    JobConfig,
    JobFile,
    WorkerAddr,
    job_to_dict,
    load_worker_file,
)
from spina.net import free_port

FIELDS = [f.name for f in dataclasses.fields(JobConfig)]
SWITCH = ("127.0.0.1", 47000)


def non_default(f: dataclasses.Field):
    """A valid value of option `f` other than its default, from its declaration alone."""
    meta = f.metadata
    if meta["choices"]:
        return next(c for c in meta["choices"] if c != f.default)
    if meta["kind"] == "seconds":
        return LOSS_DEADLINE_AUTO if f.default != LOSS_DEADLINE_AUTO else 0.5
    if meta["kind"] is int:
        return f.default + 1
    if meta["kind"] is float:
        return f.default + 0.25
    raise AssertionError(f"job option {f.name!r}: no rule here for a value of kind "
                         f"{meta['kind']!r} other than its default")


OPTIONS = {k: non_default(f) for k, f in JOB_FIELDS.items()}
WORKERS = (WorkerAddr(0, "127.0.0.1", 50000), WorkerAddr(1, "127.0.0.1", 50001))
# A flat job: every option other than its default (narrow lanes need a flat job) ...
FLAT = JobConfig(job=7, workers=WORKERS, **OPTIONS)
# ... and a two-level one: the structural fields too (racks, a group per slot), 32-bit lanes.
TWO_LEVEL = dataclasses.replace(FLAT, lane_bits=32, racks=(1, 1),
                                slot_groups=tuple(s % 2 for s in range(OPTIONS["nslots"])))


def dropped(got: JobConfig, want: JobConfig, names=FIELDS) -> list[str]:
    """The fields of `names` in which `got` differs from `want`, each with both values."""
    return [f"{k}: {getattr(got, k)!r}, want {getattr(want, k)!r}" for k in names
            if getattr(got, k) != getattr(want, k)]


def flat_doc(jobs=()) -> dict:
    """A desired state: one software switch, FLAT's two workers, `jobs`."""
    return {"switches": [{"name": "s1", "target": "softswitch", "grpc": "in-process",
                          "address": SWITCH[0], "udp_port": SWITCH[1]}],
            "workers": [{"name": f"w{w.rank}", "ip": w.host, "udp_port": w.port,
                         "switch_port": 0} for w in WORKERS],
            "jobs": list(jobs)}


def yaml_job() -> dict:
    return {"id": FLAT.job, "members": ["w0", "w1"], **OPTIONS}


def test_the_walk_sets_every_option():
    """Every option has a value other than its default here, and the jobs are valid."""
    assert set(JOB_OPTIONS) < set(FIELDS) and {"job", "workers"} < set(FIELDS) - set(JOB_OPTIONS)
    assert [k for k in JOB_OPTIONS if OPTIONS[k] == JOB_DEFAULTS[k]] == []
    FLAT.validate(256, 16384)
    TWO_LEVEL.validate(256, 16384)
    default = JobConfig(job=0, workers=WORKERS[:1])
    assert [k for k in FIELDS if getattr(TWO_LEVEL, k) == getattr(default, k)] == ["lane_bits"]


@pytest.mark.parametrize("job", [FLAT, TWO_LEVEL], ids=["flat", "two-level"])
def test_job_files_and_assignments_keep_every_field(job, tmp_path):
    """job_to_dict names every field as declared (empty slot_groups and racks left out); a job
    file and each rank's assignment, written and read back, hold every field."""
    assert set(job_to_dict(job)) == {k for k in FIELDS if getattr(job, k) != ()}
    assert dropped(JobConfig.from_dict(json.loads(json.dumps(job_to_dict(job)))), job) == []
    JobFile(job, SWITCH).write(tmp_path / "job.json")
    assert dropped(JobFile.load(tmp_path / "job.json").job, job) == []
    for rank in range(job.nworkers):
        p = tmp_path / f"rank{rank}.json"
        p.write_text(json.dumps(Assignment(job, rank, SWITCH).to_dict()))
        assert dropped(Assignment.load(p).job, job) == []
        assert dropped(load_worker_file(p, rank).job, job) == []


def test_yaml_parse_save_and_agent_files_keep_every_option(tmp_path):
    """A YAML job with every option: parsed, saved and read again, and the agent files the
    controller writes for it, all hold every option."""
    st = state_mod.parse(flat_doc([yaml_job()]), tmp_path / "spina.yaml")
    assert dropped(st.job_config(st.jobs[7]), FLAT) == []
    st.save()
    again = state_mod.load(tmp_path / "spina.yaml")
    assert dropped(again.job_config(again.jobs[7]), FLAT) == []
    # written: the job file and two assignments; none removed
    assert Controller(again).write_agent_files() == (3, 0)
    for rank in range(2):
        got = load_worker_file(tmp_path / "agents" / f"job7-rank{rank}.json", rank).job
        assert dropped(got, FLAT) == []
    assert dropped(JobFile.load(tmp_path / "agents" / "job7.json").job, FLAT) == []


def test_with_job_keeps_every_option(tmp_path):
    """`DesiredState.with_job` writes every option into the file it saves (it once wrote no
    lane_bits: a 16-bit job came back 32-bit)."""
    st = state_mod.parse(flat_doc(), tmp_path / "spina.yaml")
    job = Job(id=FLAT.job, members=("w0", "w1"), **OPTIONS)
    new = st.with_job(job)
    assert dropped(new.job_config(new.jobs[7]), FLAT) == []
    new.save()
    again = state_mod.load(tmp_path / "spina.yaml")
    assert dropped(again.job_config(again.jobs[7]), FLAT) == []


def test_job_add_offers_and_writes_every_option(tmp_path, capsys):
    """`job add --help` lists a flag for every option, with its default; `job add` given every
    flag writes the job with every option into the file before it reaches any switch (here
    none listens: exit 2, the file written)."""
    with pytest.raises(SystemExit):
        cli_main.main(["job", "add", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for k, f in JOB_FIELDS.items():
        assert f"--{k.replace('_', '-')}" in text, k
        if k != "slot_base":  # allocated first-fit when not given
            assert f"default: {f.default})" in text, k
    path = tmp_path / "spina.yaml"
    doc = flat_doc()
    doc["switches"][0]["grpc"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    path.write_text(yaml.safe_dump(doc))
    flags = [x for k, v in OPTIONS.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    argv = ["-c", str(path), "--timeout", "0.5", "job", "add", "--id", str(FLAT.job),
            "--members", "w0,w1", *flags]
    new = state_mod.parse(flat_doc()).with_job(
        cli_main.job_from_args(cli_main._parser().parse_args(argv)))
    assert dropped(new.job_config(new.jobs[7]), FLAT) == []
    assert cli_main.main(argv) == 2
    err = capsys.readouterr().err
    assert "no P4Runtime server" in err and "\n" == err[-1] and err.count("\n") == 1, err
    written = state_mod.load(path)
    assert dropped(written.job_config(written.jobs[7]), FLAT) == []


def fabric_with_options(**edit) -> dict:
    """A fabric plan (two racks of one worker, one spine) whose job sets every option other
    than its default, 32-bit lanes aside (the leaf/spine roles carry int32 lanes only)."""
    doc = fabric_doc(racks=2, per_rack=1, spines=1)
    job = doc["fabric"]["jobs"][0]
    job.update({k: v for k, v in OPTIONS.items() if k != "lane_bits"}, **edit)
    job["shards"] = [{"spine": "spine0", "slot_base": job["slot_base"], "nslots": job["nslots"]}]
    return doc


def test_fabric_jobs_keep_every_option(tmp_path):
    """A fabric job's options reach its agents' config at every rank and each spine's share
    (its own slot range), and its assignment files; its lane_bits is read too: 16 is refused
    by name."""
    f = plan.parse(fabric_with_options())
    want = dataclasses.replace(FLAT, lane_bits=32)
    cfg = f.job_config(f.jobs[7])
    assert dropped(cfg, want, JOB_OPTIONS) == []
    (spine,) = f.spine_jobs("spine0")
    assert dropped(spine, want, JOB_OPTIONS) == []
    f.state.path = tmp_path / "spina.yaml"
    Controller(f.state).write_agent_files()
    for rank in range(2):
        got = load_worker_file(tmp_path / "agents" / f"job7-rank{rank}.json", rank).job
        assert dropped(got, want, JOB_OPTIONS) == [] and got.racks == (1, 1)
    with pytest.raises(ConfigError, match=r"^fabric\.jobs\[0\]\.lane_bits: 16-bit lanes need "
                                          "a flat job"):
        plan.parse(fabric_with_options(lane_bits=16))


def test_software_switch_files_keep_every_option():
    """The software switch's UDP jobs and L2 config become desired states holding every
    option of their jobs."""
    one = from_udp_jobs([FLAT], address=SWITCH[0], udp_port=SWITCH[1], pool_slots=256,
                        slot_capacity=16384)
    assert dropped(one.job_config(one.jobs[7]), FLAT) == []
    jd = job_to_dict(FLAT)
    for r, w in enumerate(jd["workers"]):
        w.update(mac=f"02:00:00:00:00:0{r + 1}", switch_port=r + 1)
    l2 = from_l2_config({"endpoints": ["10.0.0.100"], "jobs": [jd], "mtu": 65535},
                        slot_capacity=16384)
    assert dropped(l2.job_config(l2.jobs[7]), FLAT) == []


def test_other_programs_take_job_defaults_from_the_schema():
    """The launcher's --lane-bits and the demo's --block-size/--nslots are the schema's
    declarations (choices, default), not copies that could drift from it."""
    from host_agent.launch import parser as launch_parser
    from spina_cli.demo import parser as demo_parser
    lanes = {a.dest: a for a in launch_parser()._actions}["lane_bits"]
    assert (tuple(lanes.choices), lanes.default) == (JOB_FIELDS["lane_bits"].metadata["choices"],
                                                      JOB_FIELDS["lane_bits"].default)
    demo = {a.dest: a.default for a in demo_parser()._actions}
    assert (demo["block_size"], demo["nslots"]) == (JOB_FIELDS["block_size"].default,
                                                    JOB_FIELDS["nslots"].default)
