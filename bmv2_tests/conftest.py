"""The `target` fixture: every conformance test runs once per target.

soft: the software switch in-process, every frame through its Python pipeline (always).
soft-compiled: the same switch with its compiled frame path (softswitch/_datapath_l2.c; what
it punts, Python's), always. bmv2: simple_switch_grpc, when p4c-bm2-ss, simple_switch_grpc and
simple_switch_CLI are on PATH and we are root; otherwise each BMv2 case is skipped with the
reason. SPINA_TARGETS (a comma list of soft, soft-compiled, bmv2) restricts the run to those.
"""
from __future__ import annotations

import os

import pytest

from bmv2_tests import bmv2
from bmv2_tests.target import SoftTarget

_TARGETS = [t for t in os.environ.get("SPINA_TARGETS", "soft,soft-compiled,bmv2").split(",")
            if t]
_SOFT = {"soft": "python", "soft-compiled": "compiled"}  # target -> its Dataplane's datapath


@pytest.fixture(scope="session")
def _bmv2_switch():
    """A function giving the session's BMv2 target, started again if another test (for example
    tests/test_controller_bmv2.py in the same run) started its own switch, which stops ours."""
    why = bmv2.unavailable()
    if why:
        pytest.skip(why)
    held: list[bmv2.Bmv2Target] = []

    def switch() -> bmv2.Bmv2Target:
        if not held or held[0].closed:
            held[:] = [bmv2.Bmv2Target()]
        return held[0]
    yield switch
    if held:
        held[0].close()


@pytest.fixture(params=_TARGETS)
def target(request):
    """A clean switch: no entries, zero counters and registers."""
    if request.param in _SOFT:
        t = SoftTarget(_SOFT[request.param])
        yield t
        t.close()
        return
    t = request.getfixturevalue("_bmv2_switch")()
    t.reset()
    yield t
    t.reset()
