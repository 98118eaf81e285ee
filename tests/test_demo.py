"""The README's main job, at a small size: switch + 4 worker processes, PASS line, gloo column.

Run just this file: .venv/bin/python -m pytest tests/test_demo.py
"""
import os
import signal
import subprocess
import sys


def test_demo_passes_small():
    """`python -m spina_cli.demo` runs end to end, prints the table with gloo times and PASS;
    with --metrics its switch serves them.
    On a timeout its whole process group goes (its switch and controller too)."""
    p = subprocess.Popen([sys.executable, "-m", "spina_cli.demo", "--elements", "300001",
                          "--repeats", "1", "--densities", "1.0", "0.01", "0",
                          "--metrics", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"the demo ran over 300 s: {out[-2000:]} {err[-2000:]}") from None
    assert p.returncode == 0, out + err
    assert "| block density |" in out and "gloo" in out
    assert ", metrics http://127.0.0.1:" in out  # its switch served them (docs/operations.md)
    assert out.strip().splitlines()[-1].startswith("PASS: 3 densities")
