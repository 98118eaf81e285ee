"""python -m bench WHAT [options]: the benchmark harness (bench/harness.py, bench/README.md)."""
import sys

from bench.harness import main

sys.exit(main())
