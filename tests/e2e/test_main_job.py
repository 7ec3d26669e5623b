"""The README's main job (``./scripts/demo`` = ``kvcompass demo``) run as a user runs it:
a short replay, Ctrl-C in the middle, and a component that cannot start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvcompass.loadgen.demo import default_scenario
from kvcompass.loadgen.scenario import DemoScenario
from kvcompass.loadgen.stack import ComponentFailed, LocalStack, StackConfig
from kvcompass.loadgen.testing import poll_until
from kvcompass.topology import load_builtin

ROOT = Path(__file__).resolve().parents[2]
# The same virtualenv as this test run, so the script's set-up step is a no-op.
ENV = {**os.environ, "KVC_VENV": str(Path(sys.prefix))}


def test_readme_main_job_compares_both_routers_on_one_workload(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/demo" in readme, "the README no longer names ./scripts/demo"
    out = tmp_path / "demo"
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo"), "--seconds", "8", "--out", str(out)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout
    assert re.search(r"metric\s+local-least-loaded\s+kvcompass", table), table
    requests = re.search(
        r"^all\s+requests \(errors\)\s+(\d+) \((\d+)\)\s+(\d+) \((\d+)\)", table, re.M
    )
    assert requests is not None, table
    sent, errors, sent_again, errors_again = map(int, requests.groups())
    assert sent == sent_again > 0
    assert errors == errors_again == 0, table
    for policy in ("local-least-loaded", "kvcompass"):
        lines = (out / f"records-{policy}.jsonl").read_text().splitlines()
        assert len(lines) == sent
    assert (out / "summary.json").exists()
    assert (out / "ttft.png").stat().st_size > 10_000
    # What `kvcompass sim agree` replays: the long-context topology the demo wrote.
    scenario = DemoScenario.read(out)
    assert scenario is not None, "the demo recorded no scenario"
    assert scenario == replace(default_scenario(), topology=scenario.topology, seconds=8.0)
    assert scenario.topology_ref(out) == str(out / "testbed-3region-long-context.toml")
    assert not _stack_segments(), "shared memory left behind"


def test_ctrl_c_stops_every_component_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvcompass.services.cli",
            "demo",
            "--seconds",
            "30",
            "--out",
            str(out),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:  # until the first replay has begun
        seen.append(line)
        if "replaying with" in line or time.monotonic() > deadline:
            break
    assert any("replaying with" in line for line in seen), "".join(seen)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "interrupted; stopping every component" in rest
    # Every component ran in its own session under the demo; none may outlive it.

    poll_until(lambda: not _children_of_stack(out), 30, "every demo component gone")
    assert not _stack_segments(), "shared memory left behind"


def test_a_full_disk_under_the_records_stops_the_demo_with_one_line(tmp_path: Path) -> None:
    """A full disk under the records: the first run's file refuses every write (it is
    /dev/full). The demo stops after that run with one line naming the file's policy and
    folder, exit 1, and leaves no component or shared memory behind."""
    out = tmp_path / "demo"
    out.mkdir()
    (out / "records-local-least-loaded.jsonl").symlink_to("/dev/full")
    demo = [sys.executable, "-m", "kvcompass.services.cli", "demo", "--seconds", "4"]
    done = subprocess.run(
        [*demo, "--out", str(out)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"kvcompass demo: cannot write local-least-loaded's records under {out}: "
        "[Errno 28] No space left on device"
    ), done.stderr[-3000:]
    assert "replaying with kvcompass" not in done.stdout  # it stopped after the first run
    poll_until(lambda: not _children_of_stack(out), 30, "every demo component gone")
    assert not _stack_segments(), "shared memory left behind"


def _stack_segments() -> list[str]:
    """Shared-memory segments of any LocalStack's edges (``kvc<tag><region>-...``)."""
    pattern = re.compile(r"kvc[0-9a-f]{6}(us|eu|asia)-")
    return [p.name for p in Path("/dev/shm").iterdir() if pattern.match(p.name)]


def _children_of_stack(out: Path) -> list[int]:
    """PIDs of live processes whose environment or arguments name this demo's run
    directory (every component's KVC_TOPOLOGY, the broker's and Redis's paths)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            seen = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(out).encode() in seen:
            pids.append(int(proc.name))
    return pids


def test_a_component_that_cannot_start_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    config = StackConfig(
        topology=load_builtin("testbed-3region"),
        topology_ref="testbed-3region",
        workdir=tmp_path,
        shards=2,
        extra_env={"KVC_EVICTION_POLICY": "newest-first"},
    )
    stack = LocalStack(config)
    try:
        with pytest.raises(ComponentFailed) as failed:
            stack.start()
        # start() cleaned up after itself: servers stopped, no views left.
        assert stack.infra is None
        assert not list(Path("/dev/shm").glob(f"kvc{stack.tag}*"))
        assert not _children_of_stack(tmp_path)
    finally:
        stack.stop()
    assert failed.value.component.startswith("workers-")
    assert "KVC_EVICTION_POLICY" in str(failed.value)


def test_index_demo_builds_and_reports_a_correct_index() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvcompass.services.cli", "index-demo", "--entries", "20000"],
        env=ENV,
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
