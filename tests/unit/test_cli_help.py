"""Every ``kvcompass`` command's --help says what the command does and what each of its
options means: a user looks there before reading any document."""

from __future__ import annotations

import re

import pytest

from kvcompass.services.cli import main

#: Commands whose --help argparse writes (the services print their settings table,
#: checked in tests/integration/test_service_start.py).
COMMANDS = [
    ["index-demo"],
    ["demo"],
    ["infra"],
    ["infra", "up"],
    ["infra", "status"],
    ["infra", "down"],
    ["loadgen"],
    ["report"],
    ["sim"],
    ["sim", "run"],
    ["sim", "sweep"],
    ["sim", "agree"],
]
#: An option line of argparse's help: the flag, then its help on the same line or below.
OPTION = re.compile(r"^  (-\S.*?)(?:\s{2,}\S.*)?$")


def _help(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code: object
    try:
        code = main([*command, "--help"])
    except SystemExit as exit_:
        code = exit_.code
    assert code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_describes_the_command_and_every_option(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(command, capsys)
    # After the usage block: prose, not argparse's first heading.
    description = text.split("\n\n")[1]
    heading = re.match(r"^\S[^\n]*:(\n|$)", description)
    assert heading is None, f"no description, only {heading and heading.group(0)!r}"
    assert len(description.split()) >= 6, f"no description: {description!r}"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = OPTION.match(line)
        if match and line.rstrip() == f"  {match.group(1)}".rstrip():
            # No help on the flag's line: argparse puts it on the next, indented.
            following = lines[i + 1] if i + 1 < len(lines) else ""
            assert following.startswith(" " * 10), f"{line.strip()} has no help"
