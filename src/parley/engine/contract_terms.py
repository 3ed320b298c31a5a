"""What a turn's contract asks of an attempt: the check of a final answer (run once per
answer, announced by a ``check`` event), the budgets no step may start past, and the
outcome an accepted answer ends the turn with."""

from __future__ import annotations

from collections.abc import Callable

from parley.engine.contract_check import CheckResult, run_contract_check
from parley.engine.emitter import Emitter
from parley.engine.holding import ensure_holding
from parley.engine.turn_state import TurnState
from parley.ports.backend import ClaimedTurn
from parley.schemas.events import Checked
from parley.schemas.messages import StepInput
from parley.schemas.records import TaskContract, TurnStatus


class ContractTerms:
    """The contract of one attempt's turn (none: no check, and only the session's token
    ceiling bounds it)."""

    def __init__(self, claimed: ClaimedTurn, emitter: Emitter, holding: Callable[[], bool]):
        self.contract: TaskContract | None = claimed.run.contract
        self._ceiling = claimed.session.token_ceiling
        self._root = claimed.session.root
        self._emitter = emitter
        self._holding = holding
        # A final answer the model gives is checked by the contract's command, if any; one
        # that passes (or has nothing to pass) ends the turn with this outcome.
        self.checks = bool(self.contract and self.contract.check)
        self.answered = TurnStatus.SUCCEEDED if self.checks else TurnStatus.FINISHED

    def check(self, state: TurnState, index: int) -> CheckResult | None:
        """The contract's check of the final answer of step ``index`` (None without a
        check): run once per answer, and announced by a ``check`` event."""
        contract = self.contract
        if contract is None or not contract.check:  # self.checks, in terms mypy can narrow
            return None
        if state.contract_checked is not None and state.contract_checked[0] == index:
            return state.contract_checked[1]
        # It runs before the step commits: a driver that lost the session must not run
        # it in the workspace beside the one that took over.
        ensure_holding(self._holding, "before the check")
        result = run_contract_check(contract.check, self._root, contract.check_timeout)
        self._emitter.emit(
            Checked(passed=result.passed, exit_code=result.exit_code, output=result.output)
        )
        state.contract_checked = (index, result)
        return result

    def exceeded(self, state: TurnState) -> str | None:
        """Why no further step may start (a budget reached), or None."""
        contract = self.contract
        if contract is not None:
            if contract.max_steps is not None and len(state.steps) >= contract.max_steps:
                return f"max_steps {contract.max_steps} reached"
            if contract.max_tokens is not None and state.usage.total >= contract.max_tokens:
                return f"max_tokens {contract.max_tokens} reached ({state.usage.total} used)"
        ceiling = self._ceiling
        if ceiling is not None and state.session_tokens >= ceiling:
            return f"the session's token ceiling {ceiling} is reached"
        return None


def failed_check_feedback(failed: CheckResult) -> list[StepInput]:
    """What the model hears of a failed check, with its next request."""
    return [StepInput(origin="check", text=failed.feedback())]
