"""How :class:`~parley.store.sql_store.SqlStore` exposes its repositories' methods as its
own without inheriting them: ``create_session = exposed("sessions",
SessionStore.create_session)`` makes ``store.create_session`` the bound method of the
store's ``sessions`` repository, with the repository method's signature for mypy (a
typo'd or missing method is a type error at the call site, and a wrong part a test's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


class exposed(Generic[R, P, T]):
    """A repository's method, read through the store that holds the repository as
    ``part``.  Once read, the bound method is kept on the instance: the next read is an
    attribute's, and a test may still replace it on the instance (``monkeypatch``)."""

    def __init__(self, part: str, method: Callable[Concatenate[R, P], T]) -> None:
        self.part = part
        self.method = method
        self.name = method.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(f"{owner.__name__}.{name} exposes {self.name}: name it alike")

    @overload
    def __get__(self, instance: None, owner: type) -> exposed[R, P, T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> Callable[P, T]: ...

    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None:
            return self
        bound = getattr(getattr(instance, self.part), self.name)
        instance.__dict__[self.name] = bound
        return cast("Callable[P, T]", bound)
