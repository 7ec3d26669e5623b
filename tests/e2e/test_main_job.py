"""Smoke test of the README's main-job command, run exactly as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_main_job_runs_and_reports_a_correct_index() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/demo" in readme, "the README no longer names ./scripts/demo"
    # The same virtualenv as this test run, so the script's set-up step is a no-op.
    env = {**os.environ, "KVC_VENV": str(Path(sys.prefix))}
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo"), "--entries", "20000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = done.stdout
    assert "(0 wrong answers)" in report, report
    bits = re.search(r"view memory .*= ([0-9.]+) bits/entry", report)
    assert bits is not None, report
    # 32-bit values at 95% load: 38 bits per entry (README); more means the view grew.
    assert float(bits.group(1)) < 45, report
