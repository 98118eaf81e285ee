"""The job file's "communication" section, register_from_job and the hooks' registry
(host_agent/hooks/registry.py; docs/bits.md, issues 32 and 42).

Run just these tests:
    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_comm_hooks.py

The section's parsing and the hook choice run in this process (LocalCluster agents); one test
spawns 2 DDP processes (gloo, file:// rendezvous) against a software switch in this process and
compares each method through register_from_job with the same hook registered by hand.
"""
import importlib
import inspect
import json
import pathlib
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from host_agent import hooks, launch
from host_agent.compression import BlockTopK, SignVote, TernGrad, make_compressor
from host_agent.hooks import (
    HOOKS,
    CompressionHookState,
    LocalSGDOptimizer,
    LocalSGDState,
    SpinaHookState,
    VoteHookState,
    hook_for,
    register_from_job,
    spina_allreduce_hook,
    spina_compressed_hook,
    spina_local_sgd_hook,
    spina_vote_hook,
)
from host_agent.local import LocalCluster
from spina.communication import Communication, CompressionConfig, LocalSGDConfig
from spina.config import Assignment, ConfigError, JobFile
from tests.test_bits import _Net
from tests.test_torch_hook import finish_worker
from tests.waits import file_appears

ROOT = pathlib.Path(__file__).resolve().parents[1]
B = 16
SECTIONS = {  # one of each kind, as a job file says them
    "dense": {"method": "dense"},
    "topk": {"method": "topk", "ratio": 0.1, "momentum": 0.9, "momentum_masking": False},
    "sign": {"method": "sign", "momentum": 0.9},
    "ternary": {"method": "ternary", "clip_sigma": 2.0, "seed": 3},
    "local": {"method": "dense", "local_sgd": {"period": 2, "warmup_steps": 1}},
}


def _job_file(job, communication=None) -> JobFile:
    return JobFile(job, ("127.0.0.1", 47000), ("127.0.0.1", 47001), communication)


# ---------------------------------------------------------------- the section
def test_section_round_trips_through_dicts_and_files(tmp_path):
    """Each kind: from_dict(to_dict) is itself, in a JobFile, a file and an Assignment."""
    with LocalCluster(2, block_size=B, nlanes=4, nslots=2) as c:
        job = c.job
    for name, doc in SECTIONS.items():
        comm = Communication.from_dict(doc)
        assert comm.to_dict() == doc, name  # only what differs from the defaults is written
        jf = _job_file(job, comm)
        assert JobFile.from_dict(jf.to_dict()) == jf
        jf.write(tmp_path / f"{name}.json")
        assert JobFile.load(tmp_path / f"{name}.json") == jf
        a = Assignment(job, 1, ("127.0.0.1", 47000), None, comm)
        assert Assignment.from_dict(a.to_dict()) == a and a.job_file().communication == comm
    topk = Communication.from_dict(SECTIONS["topk"])
    assert topk.compression == CompressionConfig(method="topk", ratio=0.1, momentum=0.9,
                                                 momentum_masking=False)
    assert Communication.from_dict(SECTIONS["local"]).local_sgd == LocalSGDConfig(2, 1)
    assert Communication.from_dict({}) == Communication()  # method: dense by default
    assert "communication" not in _job_file(job).to_dict()  # none: files as before


BAD = [  # (section, the error: job file prefix, then the field)
    ({"method": "none"}, "communication.method: 'none' is not one of dense, topk, randomk, "
                         "scaled, losscomp, sign, ternary"),
    ({"method": 7}, "communication.method: 7 is not one of dense"),
    ({"metod": "topk"}, "communication.metod: unknown field (known: clip_sigma, credit_weight, "
                        "error_feedback, local_sgd, loss_window, mask_repeats, method, "
                        "min_blocks_per_param, momentum,"),
    ({"method": "dense", "ratio": 0.1},
     "communication.ratio: method 'dense' takes no compression settings"),
    ({"method": "topk", "ratio": 1.5}, "communication: field 'ratio': must be in (0, 1] (got 1.5)"),
    ({"method": "topk", "ratio": "0.1"}, "communication: field 'ratio': '0.1' is not a number"),
    ({"method": "sign", "momentum": 1}, "communication: field 'momentum': must be in [0, 1)"),
    ({"method": "ternary", "error_feedback": 1},
     "communication: field 'error_feedback': 1 is not a boolean"),
    ({"method": "topk", "local_sgd": {"period": 2}},
     "communication.local_sgd: needs method 'dense' (the synchronous steps sum dense "
     "gradients), got method 'topk'"),
    ({"local_sgd": {"period": 0}},
     "communication.local_sgd: field 'period': must be an integer >= 1 (got 0)"),
    ({"local_sgd": {"period": 2, "warmup_steps": -1}},
     "communication.local_sgd: field 'warmup_steps': must be an integer >= 0 (got -1)"),
    ({"local_sgd": {"period": True}},
     "communication.local_sgd: field 'period': True is not an integer"),
    ({"local_sgd": {"warmup_steps": 2}}, "communication.local_sgd.period: required field is "
                                         "missing"),
    ({"local_sgd": {"period": 2, "H": 4}},
     "communication.local_sgd.H: unknown field (known: period, warmup_steps)"),
    ([], "communication: must be a mapping"),
]


@pytest.mark.parametrize("section,message", BAD, ids=[m.split(":")[0] + str(i)
                                                      for i, (_, m) in enumerate(BAD)])
def test_a_bad_section_is_refused_naming_the_field(tmp_path, section, message):
    """A job file with the bad section: load fails with the path, 'job file' and the field."""
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        doc = {**_job_file(c.job).to_dict(), "communication": section}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        JobFile.load(path)
    assert str(e.value).startswith(f"{path}: job file: {message}")


def test_votes_on_narrow_lanes_are_refused_naming_both_fields():
    """sign or ternary with lane_bits 16 or 8: refused in the file and the JobFile; dense is not."""
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2, lane_bits=16) as c:
        job = c.job
    doc = {**_job_file(job).to_dict(), "communication": {"method": "ternary"}}
    with pytest.raises(ConfigError) as e:
        JobFile.from_dict(doc)
    assert str(e.value) == ("job file: communication.method: 'ternary' votes travel as int32 "
                            "on any job, so job.lane_bits 16 would only round their scale "
                            "message: give the job lane_bits 32")
    with pytest.raises(ConfigError, match="'sign' votes .* job.lane_bits 16"):
        _job_file(job, Communication.from_dict({"method": "sign"}))
    for ok in ("dense", "topk", "local"):
        assert _job_file(job, Communication.from_dict(SECTIONS[ok])).job.lane_bits == 16


# ---------------------------------------------------------------- the launcher
@pytest.mark.parametrize("argv,message", [
    (["--communication", '{"method": "topk", "ratio": 0}'],
     "argument --communication: communication: field 'ratio': must be in (0, 1] (got 0.0)"),
    (["--communication", '{"method": "sgn"}'],
     "argument --communication: communication.method: 'sgn' is not one of dense, topk"),
    (["--communication", "{method: sign}"], "argument --communication: not JSON (Expecting"),
    (["--communication", '{"method": "sign"}', "--lane-bits", "8"],
     "communication.method: 'sign' votes travel as int32 on any job, so job.lane_bits 8"),
])
def test_launch_refuses_a_bad_section_in_one_line(tmp_path, capsys, argv, message):
    """python -m host_agent launch --communication: one line naming the field, exit 2."""
    args = ["--nworkers", "2", "--job-file", str(tmp_path / "job.json")] + argv
    try:
        rc = launch.main(args)
    except SystemExit as e:  # argparse's errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m host_agent.launch: error: {message}"), err
    assert not (tmp_path / "job.json").exists()


def test_launch_writes_the_section(tmp_path):
    """serve() with a section: the job file it writes holds it and loads back equal."""
    comm = Communication.from_dict(SECTIONS["topk"])
    path, stop = tmp_path / "job.json", threading.Event()
    t = threading.Thread(target=launch.serve, args=(str(path), 2), daemon=True,
                         kwargs={"stop": stop, "communication": comm})
    t.start()
    try:
        file_appears(path, 20)
        assert json.loads(path.read_text())["communication"] == SECTIONS["topk"]
        assert JobFile.load(path).communication == comm
    finally:
        stop.set()
        t.join(10)


# ---------------------------------------------------------------- the hook chosen
class _Model:
    """Stands in for DDP: records what was registered."""

    def __init__(self):
        self.registered = []
        self.net = _Net()

    def parameters(self):
        return self.net.parameters()

    def register_comm_hook(self, state, hook):
        self.registered.append((state, hook))


def _register(agent, name, momentum=0.0):
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    comm = register_from_job(model, agent, opt, communication=SECTIONS[name])
    assert model.registered == [(comm.state, comm.hook)]
    return comm, opt


def test_register_from_job_picks_the_hook_of_each_method():
    """dense, topk, sign, ternary, local SGD: the hook function, its state and the optimiser."""
    with LocalCluster(2, block_size=B, nlanes=4, nslots=2) as c:
        agent = c.agents[1]
        comm, opt = _register(agent, "dense")
        assert comm.kind is HOOKS["dense"]
        assert comm.hook is spina_allreduce_hook and type(comm.state) is SpinaHookState
        assert comm.optimizer is opt and comm.state.agent is agent
        comm, opt = _register(agent, "topk")
        assert comm.kind is HOOKS["compressed"]
        assert comm.hook is spina_compressed_hook and type(comm.state) is CompressionHookState
        comp = comm.state.compressor
        assert type(comp) is BlockTopK and comp.block_size == B and comp.config.ratio == 0.1
        assert comm.optimizer is opt
        for name, cls in (("sign", SignVote), ("ternary", TernGrad)):
            comm, _ = _register(agent, name)
            assert comm.kind is HOOKS["votes"]
            assert comm.hook is spina_vote_hook and type(comm.state) is VoteHookState
            assert type(comm.state.compressor) is cls and comm.state.compressor.rank == 1
            assert comm.state.compressor.config == Communication.from_dict(
                SECTIONS[name]).compression
            comm.close()
        comm, opt = _register(agent, "local", momentum=0.9)
        assert comm.kind is HOOKS["local_sgd"]
        assert comm.hook is spina_local_sgd_hook and type(comm.state) is LocalSGDState
        assert (comm.state.period, comm.state.warmup_steps) == (2, 1)
        assert type(comm.optimizer) is LocalSGDOptimizer and comm.optimizer.optim is opt
        assert comm.optimizer.local is comm.state


def test_register_from_job_reads_the_agents_job_file(tmp_path, monkeypatch):
    """The section from $SPINA_JOB_FILE ({rank} filled in) or job_file; none: dense."""
    with LocalCluster(2, block_size=B, nlanes=4, nslots=2) as c:
        _job_file(c.job, Communication.from_dict(SECTIONS["sign"])).write(tmp_path / "job-1.json")
        _job_file(c.job).write(tmp_path / "plain.json")
        monkeypatch.setenv("SPINA_JOB_FILE", str(tmp_path / "job-{rank}.json"))
        comm = register_from_job(_Model(), c.agents[1])
        assert comm.hook is spina_vote_hook and comm.communication.method == "sign"
        comm.close()
        comm = register_from_job(_Model(), c.agents[1], job_file=str(tmp_path / "plain.json"))
        assert comm.hook is spina_allreduce_hook and comm.communication == Communication()
        monkeypatch.delenv("SPINA_JOB_FILE")
        with pytest.raises(ConfigError, match="no job file: pass job_file or communication"):
            register_from_job(_Model(), c.agents[0])
    with LocalCluster(2, job=9, block_size=B, nlanes=4, nslots=2) as other:
        with pytest.raises(ConfigError, match="field 'job.job': job 1, but the agent is in job 9"):
            register_from_job(_Model(), other.agents[0], job_file=str(tmp_path / "plain.json"))


def test_register_from_job_checks_what_must_agree():
    """Votes on narrow lanes, local SGD without an optimiser, double momentum: refused."""
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2, lane_bits=8) as c:
        with pytest.raises(ConfigError, match="'sign' votes .* job.lane_bits 8"):
            register_from_job(_Model(), c.agents[0], communication={"method": "sign"})
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        agent = c.agents[0]
        with pytest.raises(ConfigError, match="communication.local_sgd: register_from_job needs "
                                              "the optimizer"):
            register_from_job(_Model(), agent, communication=SECTIONS["local"])
        for name in ("topk", "sign"):  # the compressor's momentum 0.9 and the optimiser's
            with pytest.raises(ConfigError, match="field 'momentum': the compressor applies "
                                                  "momentum 0.9"):
                _register(agent, name, momentum=0.5)


# ---------------------------------------------------------------- the package and its registry
def test_the_registry_names_every_hook_of_the_package():
    """HOOKS: the 7 hooks, each (state, bucket) with Args/Returns, its state all __slots__;
    every public *_hook function of the package's modules is in it."""
    names = {t.name: (t.module, t.hook) for t in HOOKS.values()}
    assert names == {
        "dense": ("dense", "spina_allreduce_hook"),
        "compressed": ("compressed", "spina_compressed_hook"),
        "gloo_compressed": ("compressed", "gloo_compressed_hook"),
        "votes": ("votes", "spina_vote_hook"),
        "local_sgd": ("local_sgd", "spina_local_sgd_hook"),
        "overlap": ("overlap", "overlap_hook"),
        "collective": ("collective", "collective_allreduce_hook")}
    for t in HOOKS.values():
        hook, state = t.load()
        assert getattr(hooks, t.hook) is hook and getattr(hooks, t.state) is state, t.name
        assert list(inspect.signature(hook).parameters) == ["state", "bucket"], t.name
        assert "Args:" in hook.__doc__ and "Returns:" in hook.__doc__, t.name
        assert all("__slots__" in vars(c) for c in state.__mro__[:-1]), t.name  # no __dict__
    found = {name for module in hooks._MODULES
             for name in importlib.import_module(f"host_agent.hooks.{module}").__all__
             if name.endswith("_hook")}
    assert found == {t.hook for t in HOOKS.values()}


def test_the_package_loads_each_name_from_its_module():
    """host_agent.hooks.X is the X of the module _MODULES names, whose __all__ it lists."""
    for module, names in hooks._MODULES.items():
        m = importlib.import_module(f"host_agent.hooks.{module}")
        assert sorted(m.__all__) == sorted(names), module
        for name in names:
            assert getattr(hooks, name) is getattr(m, name), name
    assert set(hooks.__all__) <= set(dir(hooks))
    with pytest.raises(AttributeError, match="'host_agent.hooks' has no attribute 'nope'"):
        hooks.nope  # noqa: B018


def test_hook_for_each_section():
    """The section's method (and local_sgd) picks the registry's hook."""
    kinds = {name: hook_for(Communication.from_dict(doc)).name for name, doc in SECTIONS.items()}
    assert kinds == {"dense": "dense", "topk": "compressed", "sign": "votes",
                     "ternary": "votes", "local": "local_sgd"}


def test_the_registry_and_the_layout_import_no_torch():
    """The package, its registry, the layout, the priority sender and agent_from_env's module
    load without torch (a hook's module loads it when asked for)."""
    probe = ("import sys, host_agent.hooks, host_agent.hooks.registry, host_agent.hooks.layout,"
             " host_agent.hooks.overlap, host_agent.assignment, host_agent.compression.compressors;"
             " host_agent.hooks.hook_for; host_agent.hooks.block_aligned_layout;"
             " print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------- DDP: the same as by hand
WORLD, STEPS = 2, 4


def _by_hand(name, agent, model, opt):
    """The hook of SECTIONS[name] registered as docs/bits.md shows; returns the optimiser."""
    if name == "dense":
        model.register_comm_hook(SpinaHookState(agent), spina_allreduce_hook)
        return opt, None
    if name == "local":
        state = LocalSGDState(agent, period=2, warmup_steps=1)
        model.register_comm_hook(state, spina_local_sgd_hook)
        return LocalSGDOptimizer(opt, state), None
    comp = make_compressor(block_size=agent.job.block_size, **SECTIONS[name])
    if name == "sign":
        state = VoteHookState(comp, agent)
        model.register_comm_hook(state, spina_vote_hook)
        return opt, state
    model.register_comm_hook(CompressionHookState(comp, agent), spina_compressed_hook)
    return opt, None


def _train(rank, name, agent, tmp, through_job):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1,
                          momentum=0.9 if name in ("dense", "local") else 0.0)
    closer = None
    if through_job:
        comm = register_from_job(model, agent, opt, job_file=f"{tmp}/{name}.json")
        opt, closer = comm.optimizer, comm
    else:
        opt, closer = _by_hand(name, agent, model, opt)
    gen = torch.Generator().manual_seed(30 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if closer is not None:
        closer.close()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _ddp_worker(rank, tmp):
    """Each method twice, through register_from_job and by hand; report whether they agree."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=WORLD)
    from host_agent.assignment import agent_from_env
    agent = agent_from_env(f"{tmp}/job.json", rank=rank, timeout=20)
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in _Net().parameters()])
    report = {}
    for name in ("dense", "topk", "sign", "local"):
        ours = _train(rank, name, agent, tmp, through_job=True)
        theirs = _train(rank, name, agent, tmp, through_job=False)
        report[name] = {"identical": torch.equal(ours, theirs),
                        "trained": not torch.equal(ours, start)}
    finish_worker(rank, tmp, agent, report)


def test_ddp_through_register_from_job_is_bit_identical_to_by_hand(job_file):
    """2-rank DDP, 4 steps: dense, topk, sign and local SGD from job files = by hand, exactly."""
    tmp = job_file.parent
    jf = JobFile.load(job_file)
    for name, doc in SECTIONS.items():
        JobFile(jf.job, jf.switch, None, Communication.from_dict(doc)).write(tmp / f"{name}.json")
    mp.start_processes(_ddp_worker, args=(str(tmp),), nprocs=WORLD, join=True,
                       start_method="spawn")
    report = json.loads((tmp / "report.json").read_text())
    assert report == {name: {"identical": True, "trained": True}
                      for name in ("dense", "topk", "sign", "local")}
