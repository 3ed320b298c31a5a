"""The deployments an acceptance test runs on, declared with a marker, and the check that
a parametrised test collects a case for each deployment it declares.

A module (or a test) says what it runs on with :func:`on_deployments` (the parameter
``backend``: embedded on SQLite, embedded on PostgreSQL, the fleet) or
:func:`on_fleet_deployments` (the parameter ``deployment``: how a failure test's own fleet
is deployed, :data:`tests.support.chaos.DEPLOYMENTS`).  ``embedded_only`` on a test keeps
the embedded ones of its module's deployments; ``also_amqp`` adds the RabbitMQ one
(to a test that is not embedded only).
Nothing is parametrised by a fixture's name alone: a test that asks for ``backend`` or
``deployment`` without the marker is an error, and so is a test that collects fewer
cases of a deployment than of another, or none of one it declares (which is how the
host-failure tests once ran 18 of their 27 cases, all on one deployment, unnoticed)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pytest

from tests.support.chaos import DEPLOYMENTS

ALL = ("embedded-sqlite", "embedded-postgres", "fleet-postgres")
EMBEDDED = ALL[:2]
AMQP = "fleet-amqp"
PARAMETERS = ("backend", "deployment")
MARKER = "deployments"


def on_deployments(*names: str) -> pytest.MarkDecorator:
    """Run each test once on each deployment ``names`` (default: :data:`ALL`), as the
    parameter ``backend``."""
    return pytest.mark.deployments(*(names or ALL), parameter="backend")


def on_fleet_deployments() -> pytest.MarkDecorator:
    """Run each failure test once on each way of deploying its own fleet (prefork and
    the Procfile's line; RabbitMQ too where ``also_amqp``), as the parameter
    ``deployment``."""
    names = [d for d in DEPLOYMENTS if d != "amqp"]
    return pytest.mark.deployments(*names, parameter="deployment", amqp="amqp")


@dataclass(frozen=True)
class Declared:
    """What one test function declares: the parameter and its deployments."""

    parameter: str
    names: tuple[str, ...]


def declared(definition: pytest.Function) -> Declared | None:
    """The deployments ``definition`` declares with its markers (None: none)."""
    marker = definition.get_closest_marker(MARKER)
    if marker is None:
        return None
    names = tuple(marker.args)
    if definition.get_closest_marker("embedded_only") is not None:
        names = tuple(n for n in names if n.startswith("embedded"))
    elif definition.get_closest_marker("also_amqp") is not None:
        names += (marker.kwargs.get("amqp", AMQP),)
    return Declared(parameter=marker.kwargs["parameter"], names=names)


def undeclared_parameter(fixturenames: Iterable[str], found: Declared | None) -> str | None:
    """The deployment parameter a test asks for without declaring it, if any."""
    wanted = found.parameter if found is not None else None
    return next((p for p in PARAMETERS if p in fixturenames and p != wanted), None)


def marked(name: str) -> object:
    """``name`` as a parameter with the marks of the services it needs."""
    marks = [pytest.mark.postgres] if "postgres" in name or "fleet" in name else []
    if "amqp" in name:
        marks.append(pytest.mark.amqp)
    return pytest.param(name, marks=marks)


def missing_cases(items: Sequence[pytest.Item], declarations: dict[str, Declared]) -> list[str]:
    """For each declaring test function (by node id, parameters left off) that collected
    a different number of cases of one of its deployments than of another, or none: what
    it declared and what it collected."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for item in items:
        function = item.nodeid.split("[", 1)[0]
        callspec = getattr(item, "callspec", None)
        if function in declarations and callspec is not None:
            counts[function][str(callspec.params.get(declarations[function].parameter))] += 1
    problems = []
    for function, declaration in declarations.items():
        collected = counts[function]
        per_name = [collected[name] for name in declaration.names]
        if min(per_name) == 0 or len(set(per_name)) > 1 or sum(per_name) != collected.total():
            problems.append(
                f"{function}: declares {declaration.parameter} on {list(declaration.names)},"
                f" collected {dict(collected)}"
            )
    return problems
