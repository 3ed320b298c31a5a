"""Where a batch's sessions keep their files (src/parley/workspaces.py): a tenant is a name,
one directory under PARLEY_WORKSPACES, held to the same pattern as the gateway's tokens
name them."""

from __future__ import annotations

from typing import Any

import pytest

from parley.errors import InvalidRequest
from parley.workspaces import check_tenant


def test_a_tenant_is_named_as_the_gateways_tokens_name_one() -> None:
    for name in (None, "acme", "a", "Team-7.prod_eu", "x" * 64):
        check_tenant(name)


@pytest.mark.parametrize(
    "name", ["", "..", "../..", "/etc", "a/b", "a\\b", ".hidden", "-x", "x" * 65, "a\x00", 7]
)
def test_a_tenant_that_is_a_path_or_not_a_name_is_refused(name: Any) -> None:
    with pytest.raises(InvalidRequest, match="tenant"):
        check_tenant(name)
