"""Build rules that pyproject.toml cannot state: the host agent's compiled core.

`make setup` (pip install -e .) builds it with the system C compiler; `make core` rebuilds it
in place after host_agent/_core.c changes. -fno-math-errno lets gcc inline rintf and vectorise
the quantize loop; the operations stay the IEEE ones numpy does (tests/test_core.py).
"""
from setuptools import Extension, setup

# The benchmarks' floor (bench/floor.py): a minimal compiled star all-reduce beside SpINA's.
FLOOR = [Extension("bench._floor", ["bench/_floor.c"],
                   extra_compile_args=["-O3", "-fno-math-errno"])]

setup(ext_modules=FLOOR + [Extension("host_agent._core", ["host_agent/_core.c"],
                                     extra_compile_args=["-O3", "-fno-math-errno"])])
