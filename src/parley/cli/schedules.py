"""``parley schedule add|list|pause|resume|delete`` (docs/reference.md#command-line):
schedules from the command line.  ``add`` prints the new schedule's id alone, so a
script can take it; whatever fires slots on the database (beat on a fleet, an embedded
client with a host) fires it."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from rich.console import Console
from rich.text import Text

from parley.cli.connecting import client_for, default_tenant
from parley.cli.output import notice
from parley.schedules import Schedule


def add(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        tenant = args.tenant
        if tenant is None and args.session is None:
            tenant = default_tenant(client)
        schedule = client.schedule(
            args.cron,
            args.prompt,
            timezone=args.timezone,
            session_id=args.session,
            root=args.root,
            tenant=tenant,
            priority=args.priority,
            overlap=args.overlap,
            name=args.name,
        )
        print(schedule.id, flush=True)
        next_at = schedule.record().next_at
    if next_at is not None:
        notice(f"first slot: {_local(next_at)} (local time)")
    return 0


def list_schedules(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        schedules = client.schedules(tenant=args.tenant)
        records = [s.record() for s in schedules]
    if args.json:
        print(json.dumps([record.to_json() for record in records]))
        return 0
    for schedule in schedules:
        console.print(_listed(schedule), soft_wrap=True)
    if not schedules:
        notice('no schedule yet: `parley schedule add "0 9 * * 1-5" PROMPT` makes one')
    return 0


def pause(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        client.get_schedule(args.schedule_id).pause()
    notice(f"schedule {args.schedule_id} paused")
    return 0


def resume(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        schedule = client.get_schedule(args.schedule_id)
        schedule.resume()
        next_at = schedule.next_at
    when = (
        ""
        if next_at is None
        else f"; next slot {next_at.astimezone().isoformat(timespec='minutes')}"
    )
    notice(f"schedule {args.schedule_id} resumed{when}")
    return 0


def delete(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        client.get_schedule(args.schedule_id).delete()
    notice(f"schedule {args.schedule_id} deleted")
    return 0


def _local(moment: datetime) -> str:
    return moment.astimezone().isoformat(timespec="minutes")


def _listed(schedule: Schedule) -> Text:
    """One schedule on one line: id, cron and zone, the next slot (local time) or
    paused, its session or tenant, its prompt's start."""
    record = schedule.record()
    when = (
        "paused"
        if record.next_at is None
        else "next " + record.next_at.astimezone().strftime("%Y-%m-%d %H:%M")
    )
    line = Text.assemble(
        (record.schedule_id, "bold"),
        f"  {record.cron:<15} {record.timezone:<20} {when:<22} {record.overlap.value:<9}",
    )
    if record.session_id is not None:
        line.append(f" session {record.session_id}", "dim")
    elif record.tenant is not None:
        line.append(f" tenant {record.tenant}", "dim")
    prompt = record.prompt.splitlines()[0] if record.prompt.strip() else ""
    line.append(f"  {prompt[:60]}")
    return line
