"""A checkout whose Cython modules were never built stops with one line saying how to
build them, not a traceback; any other missing module still raises."""

from __future__ import annotations

import pytest

from kvcompass.services import cli


def _missing(name: str) -> None:
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_an_unbuilt_compiled_module_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_command", lambda argv: _missing("kvcompass.worker.engine"))
    assert cli.main(["sim", "run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "kvcompass.worker.engine is not compiled" in err
    assert "pip install -e ." in err


@pytest.mark.parametrize("name", ["kvcompass.routing.policy", "aiokafka"])
def test_any_other_missing_module_still_raises(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(cli, "_command", lambda argv: _missing(name))
    with pytest.raises(ModuleNotFoundError):
        cli.main(["sim", "run"])
