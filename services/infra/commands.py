"""``kvcompass infra up|status|down``: the launcher's command line.

Usage: kvcompass infra up [--json | --env] [--run-dir DIR]
       kvcompass infra status [--json] [--run-dir DIR]
       kvcompass infra down [--json] [--run-dir DIR]

``up`` leaves the servers running in the background and prints their addresses; ``--env``
prints ``export KVC_...`` lines for ``eval``. Exit codes: 0 ok, 1 failed or unhealthy,
2 bad settings, 3 (status) not running.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvcompass.log import configure as configure_logging
from kvcompass.services.infra.settings import InfraSettings
from kvcompass.settings import SettingsError

__all__ = ["configure_parser", "main", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUNNING = 0, 1, 2, 3


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``up``/``status``/``down`` sub-commands to ``parser``."""
    sub = parser.add_subparsers(dest="infra_command", required=True, metavar="{up,status,down}")
    for name, text in (
        ("up", "start the broker and Redis (or adopt external ones), create the topics"),
        ("status", "report which recorded processes are alive and which ports answer"),
        ("down", "stop the recorded processes (SIGTERM, then SIGKILL) and remove the state"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument(
            "--run-dir",
            type=Path,
            default=None,
            help="state file and logs (env KVC_RUN_DIR, default run/infra; printed absolute)",
        )
        output = cmd.add_mutually_exclusive_group()
        output.add_argument("--json", action="store_true", help="print one JSON object")
        if name == "up":
            output.add_argument(
                "--env", action="store_true", help="print export lines for KVC_* addresses"
            )


def run(args: argparse.Namespace) -> int:
    """Run the parsed sub-command; returns the exit code."""
    overrides = {} if args.run_dir is None else {"run_dir": args.run_dir}
    try:
        settings = InfraSettings.from_env(**overrides)
    except SettingsError as exc:
        print(f"kvcompass infra: {exc}", file=sys.stderr)
        return EXIT_USAGE
    json_logs = settings.log_json if settings.log_json is not None else not sys.stderr.isatty()
    configure_logging(settings.log_level, json=json_logs, service="infra")

    from kvcompass.services.infra.errors import InfraError  # the clients load lazily

    command = {"up": _up, "status": _status, "down": _down}[args.infra_command]
    try:
        return command(settings, args)
    except InfraError as exc:
        print(f"kvcompass infra {args.infra_command}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m kvcompass.services.infra"
) -> int:
    """``python -m kvcompass.services.infra`` and ``kvcompass infra``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Start, inspect or stop the local Kafka-protocol broker and Redis.",
    )
    configure_parser(parser)
    return run(parser.parse_args(argv))


def _up(settings: InfraSettings, args: argparse.Namespace) -> int:
    from kvcompass.services.infra.errors import AlreadyRunning
    from kvcompass.services.infra.launcher import Infra

    try:
        running = Infra.start(settings, detach=True)
    except AlreadyRunning:
        status = Infra.status(settings)
        if not status.healthy or status.state is None:
            raise
        state, already = status.state, True
    else:
        running.detach()
        state, already = running.state, False
    if args.json:
        _print_json({**state.to_json(), "run_dir": str(settings.run_dir),
                     "already_running": already})  # fmt: skip
    elif args.env:
        print(f"export {settings.env_name('kafka_bootstrap')}={state.kafka_bootstrap}")
        print(f"export {settings.env_name('redis_url')}={state.redis_url}")
    else:
        pids = {p.name: f"{Path(p.argv[0]).name} pid {p.pid}" for p in state.processes}
        print(f"kafka_bootstrap  {state.kafka_bootstrap:<28} {pids.get('kafka', 'external')}")
        print(f"redis_url        {state.redis_url:<28} {pids.get('redis', 'external')}")
        print("topics           " + " ".join(f"{t}={n}" for t, n in state.topics.items()))
        print(f"run_dir          {settings.run_dir}")
        print("already running" if already else f"ready in {state.startup_ms:.0f} ms")
    return EXIT_OK


def _status(settings: InfraSettings, args: argparse.Namespace) -> int:
    from kvcompass.services.infra.launcher import Infra

    status = Infra.status(settings)
    code = EXIT_NOT_RUNNING if status.state is None else EXIT_OK if status.healthy else EXIT_FAILED
    if args.json:
        _print_json(
            {
                "run_dir": str(status.run_dir),
                "running": status.state is not None,
                "healthy": status.healthy,
                "problem": status.problem,
                "services": [dataclasses.asdict(s) for s in status.services],
            }
        )
        return code
    if status.state is None:
        print(f"{status.run_dir}: {status.problem}")
    for s in status.services:
        process = "external" if s.pid is None else f"pid {s.pid} {'alive' if s.alive else 'gone'}"
        answer = "answering" if s.answering else "NOT answering"
        print(f"{s.name:<6} {s.address:<28} {process:<18} {answer}")
    return code


def _down(settings: InfraSettings, args: argparse.Namespace) -> int:
    from kvcompass.services.infra.launcher import Infra

    results = Infra.down(settings)
    if args.json:
        _print_json({"stopped": [dataclasses.asdict(r) for r in results]})
        return EXIT_OK
    if not results:
        print(f"{settings.run_dir}: nothing to stop")
    for r in results:
        print(f"{r.name:<6} pid {r.pid:<8} {r.outcome}")
    return EXIT_OK


def _print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, default=str))
