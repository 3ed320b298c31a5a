"""Batch benchmark (docs/performance.md#batches): accepting a big batch, running one on
the fleet beside the same turns submitted one by one, and the gateway's memory while it
streams a batch's output file.

    .venv/bin/python -m tests.bench.batch [--accept 100000] [--lines 10000]

Needs the machine's PostgreSQL and Redis (Redis database 11 is flushed).  Starts two
single-process `parley worker`s, `parley beat` and a gateway on a fresh database:

1. uploads a JSONL file of ``--accept`` one-step lines with the official ``openai``
   client and creates its batch: the time from the upload's start to the batch
   ``in_progress`` (target ≤ 10 s), the rows written per line, then the time its cancel
   takes (every line still unstarted: the workers are paused meanwhile);
2. runs ``--lines`` one-step lines (scripted model, no delay) as one batch, from its
   submission to its last line's end, and as many turns submitted one by one through the
   Python client (``priority="batch"``) on the same fleet: turns/s, and the ratio
   (target ≥ 1.0×);
3. streams the first batch's output file through the gateway, sampling the gateway's
   resident memory (target: flat).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

import parley
from tests.bench.common import start_scripted_fleet
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis
from tests.support.gateway import TENANT, TOKEN, start_fleet_gateway, wait_ready

REDIS_URL = "redis://127.0.0.1:6379/11"
ECHO = [{"when": ".*", "steps": [{"text": "ok"}]}]


def jsonl(count: int, prefix: str) -> bytes:
    return (
        "\n".join(
            json.dumps(
                {
                    "custom_id": f"{prefix}{n}",
                    "method": "POST",
                    "url": "/v1/responses",
                    "body": {"input": f"classify ticket {n}: the card was charged twice"},
                }
            )
            for n in range(count)
        )
        + "\n"
    ).encode()


def rss(pid: int) -> int:
    """A process's resident memory, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def pause(fleet: Fleet, stopped: bool) -> None:
    """SIGSTOP (or SIGCONT) every worker: a batch accepted meanwhile stays unstarted."""
    for process in fleet.processes[:2]:  # (start_scripted_fleet's two workers)
        os.killpg(process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)


def accept(fleet: Fleet, api: OpenAI, client: parley.Client, count: int) -> dict[str, Any]:
    before = client.store.table_counts()
    data = jsonl(count, "a")
    pause(fleet, True)
    try:
        started = time.monotonic()
        upload = api.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
        uploaded = time.monotonic()
        batch = api.batches.create(
            input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
        )
        accepted = time.monotonic()
        assert batch.status == "in_progress", batch
        grown = {
            table: n - before[table]
            for table, n in client.store.table_counts().items()
            if n != before[table]
        }
        cancel_started = time.monotonic()
        api.batches.cancel(batch.id)
        cancelled = time.monotonic() - cancel_started
    finally:
        pause(fleet, False)
    return {
        "lines": count,
        "bytes": len(data),
        "upload_s": uploaded - started,
        "create_s": accepted - uploaded,
        "to_in_progress_s": accepted - started,
        "rows_per_line": {t: round(n / count, 2) for t, n in sorted(grown.items())},
        "cancel_s": cancelled,
    }


def run_batch(api: OpenAI, client: parley.Client, count: int) -> tuple[float, str]:
    """The batch through the gateway, from the upload to its last line's end."""
    data = jsonl(count, "r")
    started = time.monotonic()
    upload = api.files.create(file=("run.jsonl", io.BytesIO(data)), purpose="batch")
    batch = api.batches.create(
        input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
    )
    handle = client.batch(batch.id)
    while not handle.status().ended:
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    assert handle.status().request_counts["completed"] == count, handle.status()
    return count / elapsed, batch.id


def run_one_by_one(client: parley.Client, root: Path, count: int) -> float:
    started = time.monotonic()
    handles = [client.open_session(root).submit("x", priority="batch") for _ in range(count)]
    for handle in handles:
        assert handle.wait(600).outcome is parley.TurnStatus.FINISHED
    return count / (time.monotonic() - started)


def stream_output(gateway_url: str, pid: int, file_id: str) -> dict[str, Any]:
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(rss(pid))
            time.sleep(0.02)

    before = rss(pid)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    size = 0
    started = time.monotonic()
    with httpx.stream(
        "GET",
        f"{gateway_url}/v1/files/{file_id}/content",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=600,
    ) as answer:
        assert answer.status_code == 200, answer.read()
        for chunk in answer.iter_bytes():
            size += len(chunk)
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    return {
        "file_bytes": size,
        "seconds": elapsed,
        "rss_before_mb": before / 2**20,
        "rss_peak_mb": max(samples, default=before) / 2**20,
        "rss_after_mb": rss(pid) / 2**20,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accept", type=int, default=100_000)
    parser.add_argument("--lines", type=int, default=10_000)
    args = parser.parse_args()
    flush_redis(REDIS_URL)
    with (
        tempfile.TemporaryDirectory() as tmp,
        fresh_postgres_database("bench_batch") as url,
    ):
        directory = Path(tmp)
        fleet, root = start_scripted_fleet(url, REDIS_URL, directory, ECHO)
        try:
            gateway = start_fleet_gateway(fleet, directory / "workspaces")
            wait_ready(gateway)
            api = OpenAI(base_url=f"{gateway.url}/v1", api_key=TOKEN, max_retries=0, timeout=600)
            client = fleet.client()
            figures: dict[str, Any] = {"tenant": TENANT}
            figures["accept"] = accept(fleet, api, client, args.accept)
            print(json.dumps(figures["accept"]), flush=True)
            batch_rate, batch_id = run_batch(api, client, args.lines)
            single_rate = run_one_by_one(client, root, args.lines)
            figures["run"] = {
                "lines": args.lines,
                "batch_turns_per_s": batch_rate,
                "one_by_one_turns_per_s": single_rate,
                "ratio": batch_rate / single_rate,
            }
            print(json.dumps(figures["run"]), flush=True)
            output = client.batch(batch_id).status().output_file_id
            figures["stream"] = stream_output(gateway.url, gateway.pid, output)
            print(json.dumps(figures["stream"]), flush=True)
            client.close()
        finally:
            fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
