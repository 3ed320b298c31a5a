"""A host whose turns run on the plan-then-act driver (``driver.py``).

``PARLEY_HOST=examples.plan_then_act.host:host`` loads it, embedded or on workers.  Its
model is ``PARLEY_MODEL`` when that is set (a real provider), else the offline script
beside this file (``PLAN_SCRIPT`` names another).
"""

from __future__ import annotations

import os
from pathlib import Path

import parley
from examples.plan_then_act.driver import PlanThenAct
from parley.host import model_from_environment
from parley.models import ScriptedModel

HERE = Path(__file__).parent
SYSTEM_PROMPT = "You are a careful engineer: you plan before you act, then act on the plan."


def host() -> parley.Host:
    """The host, built in each process that loads it."""
    if os.environ.get("PARLEY_MODEL"):
        model = model_from_environment()
    else:
        model = ScriptedModel(os.environ.get("PLAN_SCRIPT") or HERE / "script.json")
    return parley.Host(model=model, system_prompt=SYSTEM_PROMPT, driver=PlanThenAct())
