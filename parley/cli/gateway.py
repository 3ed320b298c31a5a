"""``parley gateway``: the HTTP gateway and web page, embedded (this process runs the
turns) or a fleet producer (the workers do)."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console

import parley
from parley.cli.connecting import CHAT_SCRIPT, client_for, environment_names_a_host
from parley.client import database_url_of
from parley.deployment import is_fleet
from workers.telemetry import tracing


def gateway(args: argparse.Namespace, console: Console) -> int:
    from parley.gateway.server import Bind, admitted, serve
    from parley.gateway.settings import GatewaySettings

    tracing.name_service("parley-gateway")
    bind = Bind.parse(args.bind)
    settings = admitted(GatewaySettings.from_environment(), bind, new_token=args.new_token)
    # The port before the database: one in use stops the start with nothing opened.
    with bind.listen() as listening:
        url = database_url_of(args.db)
        note = None
        if is_fleet(url):
            # A fleet producer and reader: the workers hold the host.
            if args.host:
                raise parley.errors.InvalidRequest(
                    "on a fleet the workers hold the host: --host is for the embedded gateway"
                )
            client = parley.connect(url)
        else:
            # Embedded: this process runs the turns.  With no host named, the offline
            # scripted agent of `parley chat`, so a fresh clone serves a working page.
            if not (args.host or environment_names_a_host()):
                args.host = f"scripted:{CHAT_SCRIPT}"
                note = (
                    "the model is an offline script (set PARLEY_HOST or PARLEY_MODEL for a "
                    "real one)"
                )
                settings = dataclasses.replace(settings, sample_files=True)
            client = client_for(args, runs_turns=True)
        return serve(client, bind, listening, settings, note=note)
