"""The contract's check as a command: what it reports, including when it cannot run."""

from __future__ import annotations

from pathlib import Path

from parley.engine.contract_check import run_contract_check


def test_a_check_reports_its_exit_code_and_output(tmp_path: Path) -> None:
    result = run_contract_check("echo red; exit 3", str(tmp_path), timeout=10)
    assert (result.passed, result.exit_code, result.output) == (False, 3, "red\n")
    assert run_contract_check("true", str(tmp_path), timeout=10).passed


def test_a_check_that_cannot_start_has_not_passed_and_says_why(tmp_path: Path) -> None:
    result = run_contract_check("true", str(tmp_path / "gone"), timeout=10)
    assert not result.passed and result.exit_code is None
    assert "could not start" in result.output and "gone" in result.output
    assert "did not finish" in result.feedback()


def test_a_check_that_runs_too_long_is_stopped_and_says_so(tmp_path: Path) -> None:
    result = run_contract_check("echo started; sleep 10", str(tmp_path), timeout=0.5)
    assert not result.passed and result.exit_code is None
    assert result.output.startswith("started\n") and "timed out after 0.5 s" in result.output
