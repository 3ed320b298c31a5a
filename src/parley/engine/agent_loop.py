"""parley's own loop, the default driver: ask the model, run the calls it makes, and ask
again until it answers without calls."""

from __future__ import annotations

from parley.ports.driver import DriverTurn


class AgentLoop:
    """The default :class:`~parley.ports.driver.SessionDriver`."""

    def drive(self, turn: DriverTurn) -> None:
        """One step after another until the model answers (the engine then ends the
        turn, or drives it again for a steer that came after the answer)."""
        steps = turn.steps
        if turn.input.kind == "resume" and steps and not steps[-1].tool_calls:
            # It had answered before this attempt (the end was not committed yet): the
            # engine settles that answer, or brings what is pending as a new input.
            return
        while True:
            step = turn.step()
            if step.ended or not step.tool_calls:
                return
