"""Build rules that pyproject.toml cannot state: the compiled parts of the host agent and the
software switch.

`make setup` (pip install -e .) builds them with the system C compiler; `make core` rebuilds
them in place after a change. host_agent._core is the agent's per-datagram work, one C file
per Python module it is the twin of (host_agent/_core.h lists them): -fno-math-errno lets gcc
inline rintf and vectorise the quantize loop, -fno-trapping-math lets it vectorise the narrow
rows' comparisons (no floating-point exception is ever read); the operations stay the IEEE
ones numpy does (tests/test_core.py); -fvisibility=hidden keeps the functions its files
share to itself.
host_agent/compression/_kernels.c is the compressor's pass over a bucket: -ffp-contract=off
keeps gcc from fusing a multiply and an add, so every result is the one its numpy definition
gives (tests/test_compression.py).
"""
import os
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class AtomicBuildExt(build_ext):
    """Puts each built module in place by rename, not by writing over it: a benchmark or test
    that has the old .so mapped (a run from the same tree during `make core`) keeps its file
    instead of crashing on one rewritten under it."""

    def copy_file(self, infile, outfile, *args, **kwargs):
        tmp = f"{outfile}.{os.getpid()}.tmp"
        done = super().copy_file(infile, tmp, *args, **kwargs)
        os.replace(tmp, outfile)
        return outfile, done[1]

HEADERS = sorted(glob("spina/_*.h"))  # shared by every extension: a change rebuilds them
CORE = sorted(glob("host_agent/_core*.c"))  # _core.c, the module, and its parts
if not CORE:
    raise SystemExit("setup.py: run it from the repository's root (host_agent/_core*.c not found)")
# The benchmarks' floor (bench/floor.py): a minimal compiled star all-reduce beside SpINA's.
FLOOR = [Extension("bench._floor", ["bench/_floor.c"],
                   extra_compile_args=["-O3", "-fno-math-errno"])]

# The software switch's UDP data path (softswitch/_datapath.c; softswitch/pipeline.py is the
# reference it is checked against, tests/test_datapath.py).
DATAPATH = [Extension("softswitch._datapath", ["softswitch/_datapath.c"],
                      depends=HEADERS + ["softswitch/_datapath_l2.c"],
                      extra_compile_args=["-O3"])]

setup(cmdclass={"build_ext": AtomicBuildExt}, ext_modules=FLOOR + DATAPATH + [
    Extension("host_agent._core", CORE, depends=HEADERS + ["host_agent/_core.h"],
              extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math",
                                  "-fvisibility=hidden"]),
    Extension("host_agent.compression._kernels", ["host_agent/compression/_kernels.c"],
              depends=HEADERS, extra_compile_args=["-O3", "-ffp-contract=off"])])
