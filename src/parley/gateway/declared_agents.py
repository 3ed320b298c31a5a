"""The agents the gateway's host declares, as its protocols offer them: one MCP tool each
beside ``ask`` (docs/protocols.md#4-mcp), one A2A skill each beside ``ask``
(docs/protocols.md#5-a2a)."""

from __future__ import annotations

import functools
import logging

from parley.client import Client
from parley.errors import ParleyError
from parley.host import Host, load_host

ASK = "ask"
"""The name of the host's own agent (the MCP tool, the A2A skill)."""

log = logging.getLogger("parley.gateway")


def declared_agents(client: Client, named: str | None = None) -> dict[str, str]:
    """The agents the host declares at its top level (name → description): the
    gateway's host's when it runs turns (embedded), else those of the host ``named``
    (``PARLEY_HOST``: on a fleet the workers' host, loaded here for its declarations
    only), else none.  An agent named ``ask`` is left out: the name is the host's own
    agent's."""
    host = client.host if client.host is not None else _declared_by(named)
    if host is None:
        return {}
    return {agent.name: agent.description for agent in host.agents if agent.name != ASK}


@functools.cache
def _declared_by(named: str | None) -> Host | None:
    """The host ``named``, loaded once per process; None (said once in the log) if it
    cannot be loaded: the gateway then offers ``ask`` alone rather than failing."""
    if not named:
        return None
    try:
        return load_host(named)
    except (ParleyError, ImportError) as exc:
        log.warning("PARLEY_HOST %r could not be loaded for its agents: %s", named, exc)
        return None


__all__ = ["ASK", "declared_agents"]
