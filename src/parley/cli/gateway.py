"""``parley gateway``: the HTTP gateway and web page, embedded (this process runs the
turns) or a fleet producer (the workers do)."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console

import parley
from parley.cli.connecting import client_for, names_a_host
from parley.client import database_url_of
from parley.deployment import is_fleet
from parley.telemetry import tracing


def gateway(args: argparse.Namespace, console: Console) -> int:
    from parley.gateway.server import Bind, admitted, serve
    from parley.gateway.settings import GatewaySettings

    tracing.name_service("parley-gateway")
    bind = Bind.parse(args.bind, args.settings.port)
    gateway_settings = GatewaySettings.from_settings(args.settings)
    settings = admitted(gateway_settings, bind, new_token=args.new_token)
    # The port before the database: one in use stops the start with nothing opened.
    with bind.listen() as listening:
        url = database_url_of(args.db, args.settings)
        if is_fleet(url, args.settings):
            # A fleet producer and reader: the workers hold the host.
            if args.host:
                raise parley.errors.InvalidRequest(
                    "on a fleet the workers hold the host: --host is for the embedded gateway"
                )
            client = parley.connect(url, settings=args.settings)
        else:
            # Embedded: this process runs the turns.  With no host named, the offline
            # agent (said on stderr), and new workspaces get files for it to find, so a
            # fresh clone serves a working page.
            if not names_a_host(args):
                settings = dataclasses.replace(settings, sample_files=True)
            client = client_for(args, runs_turns=True)
        return serve(client, bind, listening, settings)
