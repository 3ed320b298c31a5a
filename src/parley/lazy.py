"""Names a package exports but loads on first use: the network clients and the MCP SDK
take a second or more to import, which every ``import parley`` (the CLI, each worker)
would otherwise pay even when it never uses them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose ``namespace`` (its
    globals) gains each name of ``table`` (name → module defining it) when first asked."""

    def module_getattr(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # once loaded, an ordinary attribute
        return value

    def module_dir() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return module_getattr, module_dir
