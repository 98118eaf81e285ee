"""Build rules that pyproject.toml cannot state: the compiled parts of the host agent and the
software switch.

`make setup` (pip install -e .) builds them with the system C compiler; `make core` rebuilds
them in place after a change. host_agent._core is the agent's per-datagram work, one C file
per Python module it is the twin of (host_agent/_core.h lists them): -fno-math-errno lets gcc
inline rintf and vectorise the quantize loop; the operations stay the IEEE ones numpy does
(tests/test_core.py); -fvisibility=hidden keeps the functions its files share to itself.
host_agent/compression/_kernels.c is the compressor's pass over a bucket: -ffp-contract=off
keeps gcc from fusing a multiply and an add, so every result is the one its numpy definition
gives (tests/test_compression.py).
"""
from glob import glob

from setuptools import Extension, setup

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

setup(ext_modules=FLOOR + DATAPATH + [
    Extension("host_agent._core", CORE, depends=HEADERS + ["host_agent/_core.h"],
              extra_compile_args=["-O3", "-fno-math-errno", "-fvisibility=hidden"]),
    Extension("host_agent.compression._kernels", ["host_agent/compression/_kernels.c"],
              depends=HEADERS, extra_compile_args=["-O3", "-ffp-contract=off"])])
