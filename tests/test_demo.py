"""The README's main job, at a small size: switch + 4 worker processes, PASS line, gloo column.

Run just this file: .venv/bin/python -m pytest tests/test_demo.py
"""
import subprocess
import sys


def test_demo_passes_small():
    """`python -m spina_cli.demo` runs end to end, prints the table with gloo times and PASS."""
    r = subprocess.run([sys.executable, "-m", "spina_cli.demo", "--elements", "300001",
                        "--repeats", "1", "--densities", "1.0", "0.01", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| block density |" in r.stdout and "gloo" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("PASS: 3 densities")
