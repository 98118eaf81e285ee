"""Child-process helpers shared by tests, the testbed and the demo."""
from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> int:
    """SIGTERM `proc` (a clean exit), SIGKILL it if it has not exited after `timeout` seconds;
    returns its exit code."""
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
