"""`python -m bench.dlcp_bench`: the command line of bench/dlcp_bench/cli.py."""
import sys

from bench.dlcp_bench.cli import main

sys.exit(main())
