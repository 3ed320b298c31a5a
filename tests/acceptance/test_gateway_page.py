"""The gateway's web page in a real browser (Chromium, driven by Playwright): a real
``parley gateway`` process on loopback with a scripted model, opened with the URL it
prints.  A message streams its reply; the same box steers a running turn and the model
hears it; Interrupt cancels and Resume finishes; "Branch from here" moves the head and a
new turn hangs under the earlier one; Approve and Deny answer a call that waits, a steer
the turn stopped before taking is sent again as a message, and an older turn shows its
steps when asked; a reload keeps the conversation, and picks up a turn that is still
running; a stream cut mid-turn reconnects with nothing shown twice; the browser's own
``EventSource`` reads the native stream across a silence longer than the keep-alive; and
a batch ``parley batch submit`` runs on the same database appears on an open page with no
reload, its sessions under it, its counts moving, while a page opened without a session
opens the newest conversation (and with no batch, the sidebar has no Batches heading).

Screenshots of each stage go to ``tmp_path`` and, when ``PARLEY_SCREENSHOTS`` names a
directory, are copied there."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, Route, expect, sync_playwright

from tests.support.helpers import Control

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).parents[2]

# The gateway runs its turns in-process on SQLite, with a scripted host of its own.
pytestmark = [
    pytest.mark.embedded_only,
    pytest.mark.slow,
]

expect.set_options(timeout=20_000)

KEEPALIVE_SECONDS = 0.3
PAUSED_REPLY = "Before the pause, after it."
"""A reply quiet mid-text for several keep-alives."""
SLOW_OPENING = "Here is a slow story, told slowly so that there is time to steer it or stop it. "
NUMBERS = "".join(f"w{i:03d} " for i in range(1, 121))
"""A long step of distinct words: a word shown twice or skipped is easy to see."""

MARKDOWN = (
    "# Plan\n\nThis is **bold**, *slanted* and `inline code`.\n\n"
    "- first\n- second\n\n"
    "```python\nprint('hi')  # <b>not bold</b>\n```\n\n"
    "A [link](https://example.com/docs) and [a script](javascript:window.ran=3).\n\n"
    '<script>window.ran = 1</script><img src=x onerror="window.ran = 2">\n\n'
    "![a picture](https://example.com/p.png)\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n"
)
"""A reply with what the chat UIs render, and what must never run."""

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "(?i)slow",
            "steps": [
                {
                    "text": SLOW_OPENING * 2,
                    "chunk_chars": 4,
                    "delay_ms": 45,
                    "tool_calls": [{"name": "list_files", "arguments": {}}],
                },
                {
                    "text": 'Latest word from you: "{last_message}". The end.',
                    "chunk_chars": 4,
                    "delay_ms": 30,
                },
            ],
        },
        *(
            {
                "when": when,
                "steps": [
                    {
                        "text": "Counting. ",
                        "tool_calls": [{"name": "list_files", "arguments": {}}],
                    },
                    {"text": NUMBERS, "chunk_chars": 5, "delay_ms": delay},
                ],
            }
            # The second count leaves time for a reload and some scrolling while it runs.
            for when, delay in (("(?i)count again", 55), ("(?i)count", 35))
        ),
        {
            "when": "(?i)outside",
            "steps": [
                {
                    "text": "Writing it next to the workspace. ",
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "../x.txt", "content": "x"}}
                    ],
                },
                {"text": "The policy said no, so I left it."},
            ],
        },
        {
            "when": "(?i)pause",
            "steps": [
                {"text": PAUSED_REPLY, "chunk_chars": 17, "delay_ms": KEEPALIVE_SECONDS * 5000}
            ],
        },
        {"when": "(?i)markdown", "steps": [{"text": MARKDOWN, "chunk_chars": 7, "delay_ms": 10}]},
        # A line that runs until it is stopped (a minute and more).
        {"when": "(?i)linger", "steps": [{"text": "w " * 80, "chunk_chars": 2, "delay_ms": 1000}]},
        {"when": ".*", "steps": [{"text": "You said: {last_message}", "chunk_chars": 3}]},
    ]
}


@dataclass
class Gateway:
    """A ``parley gateway`` process and the page URL it printed."""

    process: subprocess.Popen[str]
    url: str
    log: Path
    lines: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def token(self) -> str:
        return parse_qs(urlsplit(self.url).query)["token"][0]

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer to ``method path`` with ``body`` (JSON), as this tab's token."""
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    yield from run_gateway(tmp_path, host=f"scripted:{script}")


LIMITED_RPM = 6
"""The scripted model's limit on the limited gateway: after one call, the next waits about
ten seconds for capacity (the bucket holds one request, refilled at 95 % of 6 a minute),
long enough to see and to reload in on a busy machine, and to let its worker go."""


@pytest.fixture
def limited_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """The scripted gateway with its model limited (docs/admission.md#limits)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    yield from run_gateway(
        tmp_path,
        host=f"scripted:{script}",
        extra={"PARLEY_MODEL_LIMITS": f"scripted={LIMITED_RPM}rpm"},
    )


RECORD = {
    "when": "(?i)^record",
    "steps": [
        {
            "text": "Recording it. ",
            "tool_calls": [{"name": "record_call", "arguments": {"note": "from the page"}}],
        },
        {"text": "Asked, and answered."},
    ],
}
"""A call the asking gateway's policy asks about."""


@pytest.fixture
def asking_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on the acceptance suite's workspace host, whose policy asks before every
    ``record_call`` (docs/approvals.md), and whose model follows :data:`SCRIPT` after
    :data:`RECORD`."""
    control = Control(tmp_path / "ws" / "local" / "any")  # the tenant local's workspaces
    control.script([RECORD, *SCRIPT["rules"]])
    control.policy(ask_tools=["record_call"])
    yield from run_gateway(tmp_path, host="tests.support.hosts:workspace_host")


AWAIT = {
    "when": "(?i)^await",
    "steps": [
        {
            "text": "Waiting for finance. ",
            "tool_calls": [{"name": "wait", "arguments": {"event": "approved", "seconds": 3600}}],
        },
        {"text": "Finance answered."},
    ],
}
"""A turn that waits for the event ``approved`` (docs/time.md#waiting-for-an-event)."""


@pytest.fixture
def waiting_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on the waiting host (the built-in ``wait`` tool offered), whose model
    follows :data:`AWAIT` before :data:`SCRIPT`."""
    control = Control(tmp_path / "ws" / "local" / "any")
    control.script([AWAIT, *SCRIPT["rules"]])
    yield from run_gateway(tmp_path, host="tests.support.hosts:waiting_host")


BIG_REPLY = "A long answer. " * 1500  # about 5,600 tokens a turn
COMPACTING = [
    {"when": "^USER: ", "steps": [{"text": "## Goal\nlong answers\n## Next steps\nmore"}]},
    {"when": "(?i)^slow", "steps": [{"text": BIG_REPLY, "chunk_chars": 300, "delay_ms": 120}]},
    {"when": "(?i)^big", "steps": [{"text": BIG_REPLY, "chunk_chars": 500}]},
]


@pytest.fixture
def compacting_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on the workspace host that summarizes a session before a turn whose
    first request passes 10,000 tokens (tests.support.hosts.compacting_host)."""
    control = Control(tmp_path / "ws" / "local" / "any")
    control.script([*COMPACTING, *SCRIPT["rules"]])
    yield from run_gateway(tmp_path, host="tests.support.hosts:compacting_host")


def agent_call(task: str) -> dict[str, Any]:
    return {"name": "researcher", "arguments": {"task": task}}


CHILD_WORDS = "".join(f"c{i:02d} " for i in range(1, 81))
"""What each child streams, slowly: long enough to see both cards grow at the same time."""
FAN_OUT_TWO: list[dict[str, Any]] = [
    {
        "when": "^fan out",
        "steps": [
            {
                "text": "Asking two researchers. ",
                "tool_calls": [agent_call("topic alpha"), agent_call("topic beta")],
            },
            {"text": "Both reported back."},
        ],
    },
    {
        "when": "^topic",
        "steps": [{"text": "On {prompt}: " + CHILD_WORDS, "chunk_chars": 4, "delay_ms": 150}],
    },
]
"""A parent that fans out to two researchers, whose replies stream slowly."""


@pytest.fixture
def agents_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on the acceptance suite's agents host (docs/sub-agents.md: a researcher
    agent), whose model follows :data:`FAN_OUT_TWO`, then :data:`SCRIPT`."""
    control = Control(tmp_path / "ws" / "local" / "any")
    control.script([*FAN_OUT_TWO, *SCRIPT["rules"]])
    yield from run_gateway(tmp_path, host="tests.support.hosts:agents_host")


@pytest.fixture
def offline_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """The gateway as a fresh clone starts it: no host named, the offline agent."""
    yield from run_gateway(tmp_path, host=None)


def run_gateway(
    tmp_path: Path, host: str | None, extra: dict[str, str] | None = None
) -> Iterator[Gateway]:
    """A gateway process on SQLite in ``tmp_path`` with ``host`` (None: none named) and
    ``extra`` in its environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PARLEY_GATEWAY_TOKENS",
            "PARLEY_REDIS_URL",
            "PARLEY_DATABASE_URL",
            "PARLEY_HOST",
            "PARLEY_MODEL",
        )
    }
    env.update(
        PARLEY_DATABASE_URL=f"sqlite:///{tmp_path / 'p.db'}",
        PARLEY_WORKSPACES=str(tmp_path / "ws"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
        PARLEY_GATEWAY_KEEPALIVE=str(KEEPALIVE_SECONDS),
    )
    if host is not None:
        env["PARLEY_HOST"] = host
    env.update(extra or {})
    log = tmp_path / "gateway.log"
    port = free_port()
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "parley", "gateway", "--bind", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=tmp_path,
        )
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    url = None
    try:
        while url is None:
            try:
                line = lines.get(timeout=30)
            except queue.Empty:
                break
            if line is None:
                break
            found = re.search(rf"http://127\.0\.0\.1:{port}/\?token=[^\s]+", line)
            url = found.group(0) if found else None
        assert url is not None, (
            f"the gateway printed no page URL; stdout: {''.join(seen)!r}; "
            f"stderr: {log.read_text()!r}"
        )
        yield Gateway(process=process, url=url, log=log, lines=seen)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Never skipped: the page is tested in a real browser or the suite fails.
    assert Path(CHROMIUM).exists(), "needs Debian's Chromium: apt-get install chromium"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield chromium
        chromium.close()


class Shots:
    """Numbered screenshots of the stages of one test."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.dir = tmp_path / "screenshots"
        self.dir.mkdir()
        self.name = name
        self.count = 0
        copy = os.environ.get("PARLEY_SCREENSHOTS")
        self.copy = Path(copy) if copy else None

    def __call__(self, page: Page, stage: str) -> None:
        self.count += 1
        path = self.dir / f"{self.name}-{self.count:02d}-{stage}.png"
        page.screenshot(path=str(path))
        if self.copy is not None:
            self.copy.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.copy / path.name)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"the page raised: {errors}"


def turns(page: Page) -> Locator:
    return page.locator("#turns > li.turn")


def send(page: Page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def session_id(page: Page) -> str:
    match = re.search(r"#s=([0-9a-f-]+)", page.url)
    assert match, page.url
    return match.group(1)


def step_text(turn: Locator, index: int) -> str:
    """The text on screen for step ``index`` of a turn (the caret is no text)."""
    text: str = turn.locator(f".step[data-step='{index}'] .text").first.evaluate(
        "el => el.textContent"
    )
    return text


def test_a_conversation_in_the_browser(gateway: Gateway, page: Page, tmp_path: Path) -> None:
    shot = Shots(tmp_path, "conversation")
    page.goto(gateway.url)
    box = page.get_by_role("textbox", name="Message")
    expect(box).to_be_focused()
    # Shift+Enter is a new line, not a send.
    box.press_sequentially("two")
    box.press("Shift+Enter")
    box.press_sequentially("lines")
    expect(box).to_have_value("two\nlines")
    box.fill("")
    # The token is kept for the tab and taken out of the address bar.
    assert "token=" not in page.url
    expect(page.get_by_text("Start a conversation")).to_be_visible()
    shot(page, "empty")

    # A first message makes a session and streams its reply; markup is shown as text.
    markup = "hello <b>there</b> & <img src=x>"
    send(page, markup)
    first = turns(page).nth(0)
    expect(first.locator(".agent-body")).to_contain_text(f"You said: {markup}")
    expect(first.locator(".badge")).to_have_text("finished")
    assert page.locator("#turns b, #turns img").count() == 0
    sid = session_id(page)
    expect(page.locator("#session-list .session-item.current")).to_contain_text("hello")
    shot(page, "first-reply")

    # A call the policy refuses shows as a refusal, with its rule.
    send(page, "write outside the workspace")
    refused = turns(page).nth(1)
    expect(refused.locator(".refusal")).to_contain_text("Refused write_file by root")
    expect(refused.locator(".tool-state")).to_have_text("refused")
    expect(refused.locator(".badge")).to_have_text("finished")
    expect(refused).to_contain_text("The policy said no, so I left it.")
    refused.locator(".tool summary").click()
    expect(refused.locator(".tool pre").first).to_contain_text('"path": "../x.txt"')
    shot(page, "refusal")

    # While a turn runs the same box steers it: the model hears the steer.
    send(page, "tell me a slow story")
    story = turns(page).nth(2)
    expect(story.locator(".step .text").first).to_contain_text("Here is a slow story")
    expect(page.locator("#mode-pill")).to_be_visible()
    expect(page.get_by_role("button", name="Interrupt")).to_be_visible()
    assert story.locator(".badge").inner_text() == "running"
    shot(page, "streaming")
    send(page, "make it about cats")
    expect(story.locator(".steer-row")).to_contain_text("make it about cats")
    shot(page, "steer-sent")
    expect(story).to_contain_text('Latest word from you: "make it about cats". The end.')
    expect(story.locator(".steer-row.delivered")).to_contain_text("make it about cats")
    # Announced once the step it reached committed, it is shown above that step.
    expect(story.locator(".steer-row.delivered + .step")).to_contain_text("Latest word")
    expect(story.locator(".badge")).to_have_text("finished")
    expect(story.locator(".tool")).to_have_count(1)
    expect(page.get_by_role("button", name="Interrupt")).to_be_hidden()
    expect(box).to_be_focused()
    shot(page, "steered")

    # Interrupt stops the running turn (cancelled); Resume carries it on to the end.
    send(page, "another slow story")
    again = turns(page).nth(3)
    expect(again.locator(".step .text").first).to_contain_text("Here is a slow")
    page.get_by_role("button", name="Interrupt").click()
    expect(again.locator(".badge")).to_have_text("cancelled")
    expect(again.get_by_role("button", name="Resume")).to_be_visible()
    shot(page, "cancelled")
    again.get_by_role("button", name="Resume").click()
    expect(again.locator(".badge")).to_have_text("running")
    expect(again.locator(".badge")).to_have_text("finished")
    expect(again).to_contain_text('Latest word from you: "another slow story". The end.')
    expect(again.get_by_role("button", name="Resume")).to_have_count(0)
    # The interrupted attempt's text is struck off, not shown as if it were the answer.
    expect(again.locator(".step:not(.superseded) .text").first).to_have_text(SLOW_OPENING * 2)
    shot(page, "resumed")
    tree = page.locator("#tree")
    expect(tree.locator(".node-row")).to_have_count(4)
    expect(tree.locator(".node-row.head")).to_contain_text("another slow story")

    # Branch from the first turn: the head moves there, and the next turn hangs under it.
    first_row = tree.locator(".node-row").filter(has_text="hello")
    first_id = first_row.get_attribute("data-turn-id")
    first_row.get_by_role("button", name="Branch from here").click()
    expect(tree.locator(".node-row.head")).to_contain_text("hello")
    expect(turns(page)).to_have_count(1)
    assert gateway.get(f"/v1/sessions/{sid}")["head_turn_id"] == first_id
    send(page, "after the branch")
    expect(turns(page).nth(1).locator(".agent-body")).to_contain_text("You said: after the branch")
    expect(turns(page).nth(1).locator(".badge")).to_have_text("finished")
    expect(tree.locator(".node-row")).to_have_count(5)
    expect(tree.locator(".node-row.head")).to_contain_text("after the branch")
    # The first turn now has two children: two branches hang under it.
    fork = tree.locator(".fork")
    expect(fork.locator(":scope > .branch-line")).to_have_count(2)
    expect(fork).to_contain_text("write outside the workspace")
    expect(fork).to_contain_text("after the branch")
    shot(page, "branched")
    tree_turns = gateway.get(f"/v1/sessions/{sid}/tree")["turns"]
    [branched] = [t for t in tree_turns if t["prompt"] == "after the branch"]
    assert branched["parent_id"] == first_id

    # A reload keeps the session (from the address) and its conversation.
    page.reload()
    assert session_id(page) == sid and "token=" not in page.url
    expect(turns(page)).to_have_count(2)
    expect(turns(page).nth(0).locator(".bubble.user")).to_have_text(markup)
    expect(turns(page).nth(1).locator(".agent-body")).to_contain_text("You said: after the branch")
    expect(tree.locator(".node-row")).to_have_count(5)
    shot(page, "reloaded")
    page.emulate_media(color_scheme="dark")
    page.locator(".node-row").filter(has_text="another slow story").locator(".node-label").click()
    expect(page.locator(".banner")).to_contain_text("on another branch")
    shot(page, "dark")
    page.set_viewport_size({"width": 420, "height": 820})
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    shot(page, "narrow")

    # A tab without the token is told where to get it.
    stranger = page.context.new_page()
    stranger.goto(gateway.base + "/?token=not-the-token")
    expect(stranger.get_by_text("Open the URL the gateway printed")).to_be_visible()
    shot(stranger, "unauthorized")
    stranger.close()


def test_a_dropped_stream_reconnects_and_a_reload_picks_up_the_running_turn(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "reconnect")
    requests: list[str | None] = []  # each stream's Last-Event-ID (a cursor of the tree)

    def cut_first_streams(route: Route) -> None:
        """The first stream is cut off mid-turn (in the middle of a frame, after a word of
        the long step), the second fails outright; later ones reach the gateway."""
        requests.append(route.request.headers.get("last-event-id"))
        if len(requests) == 2:
            route.abort("connectionreset")
            return
        if len(requests) > 2:
            route.continue_()
            return
        assert requests[0] is None  # the first from the start
        upstream = urllib.request.Request(
            gateway.base + urlsplit(route.request.url).path + "?children=1",
            headers={"Authorization": f"Bearer {gateway.token}"},
        )
        body = ""
        with urllib.request.urlopen(upstream, timeout=30) as stream:
            while "w010" not in body:
                line = stream.readline().decode()
                assert line, "the stream ended before the cut"
                body += line
            # Read on to the next frame's middle: the page must drop the half frame.
            for _ in range(2):
                body += stream.readline().decode()
            body += stream.readline().decode()[:20]
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    page.route(re.compile(r"/v1/turns/[^/]+/events"), cut_first_streams)
    page.goto(gateway.url)
    send(page, "count for me")
    turn = turns(page).nth(0)
    expect(turn.locator(".badge")).to_have_text("running")
    expect(turn.locator(".step[data-step='1'] .text")).to_contain_text("w060")
    # Every word once, in order, up to where it is now.
    shown = step_text(turn, 1)
    assert NUMBERS.startswith(shown), shown
    assert len(requests) >= 3 and requests[0] is None
    assert requests[1] and requests[2] == requests[1], requests
    expect(turn.locator(".tool")).to_have_count(1)
    expect(turn.locator(".step-divider")).to_have_count(1)
    shot(page, "reconnected")
    expect(turn.locator(".badge")).to_have_text("finished")
    assert step_text(turn, 1) == NUMBERS
    expect(turn.locator(".step-divider")).to_have_count(2)
    page.unroute(re.compile(r"/v1/turns/[^/]+/events"))

    # A reload while a turn runs shows it again, live, from its first event.
    page.set_viewport_size({"width": 1280, "height": 640})
    send(page, "count again")
    running = turns(page).nth(1)
    expect(running.locator(".step[data-step='1'] .text")).to_contain_text("w020")
    page.reload()
    running = turns(page).nth(1)
    expect(running.locator(".badge")).to_have_text("running")
    expect(running.locator(".tool")).to_have_count(1)
    words = running.locator(".step[data-step='1'] .text")
    expect(words).to_contain_text("w040")

    # The view follows the stream at the bottom; scrolled up, it stays where the reader is.
    conversation = page.locator("#conversation")
    at_bottom = """() => {
        const el = document.getElementById("conversation");
        return el.scrollHeight - el.scrollTop - el.clientHeight <= 8;
    }"""
    page.wait_for_function(at_bottom, timeout=5000)
    conversation.hover()
    page.mouse.wheel(0, -200)
    expect(page.locator("#jump")).to_be_visible()
    # The wheel's scroll is animated: read where the reader is once it has come to rest.
    page.wait_for_function(
        """() => new Promise((done) => {
            const el = document.getElementById("conversation");
            const before = el.scrollTop;
            setTimeout(() => done(el.scrollTop === before), 300);
        })""",
        timeout=5000,
    )
    where = conversation.evaluate("el => el.scrollTop")
    expect(words).to_contain_text("w070")
    assert conversation.evaluate("el => el.scrollTop") == where
    page.locator("#jump").click()
    expect(page.locator("#jump")).to_be_hidden()
    expect(words).to_contain_text("w090")
    page.wait_for_function(at_bottom, timeout=5000)
    assert NUMBERS.startswith(step_text(running, 1))
    shot(page, "reloaded-live")

    # A steer that loses the race with the turn's end (409 TurnEnded) starts the next turn.
    ended = {"error": {"type": "TurnEnded", "message": "the turn has ended"}}
    page.route("**/v1/turns/*/say", lambda route: route.fulfill(status=409, json=ended))
    send(page, "too late?")
    late = turns(page).nth(2)
    expect(late.locator(".bubble.user")).to_have_text("too late?")
    expect(running.locator(".badge")).to_have_text("finished")
    assert step_text(running, 1) == NUMBERS
    expect(late.locator(".agent-body")).to_contain_text("You said: too late?")
    expect(late.locator(".badge")).to_have_text("finished")
    # The steer box is a message box again once the turn is over.
    expect(page.locator("#mode-pill")).to_be_hidden()


SPLIT_CHECK = """async (stream) => {
    const { SSEParser } = await import("/static/page/sse.js");
    const parse = (...chunks) => {
        const frames = [];
        const parser = new SSEParser((frame) => frames.push(frame));
        for (const chunk of chunks) parser.push(chunk);
        return JSON.stringify(frames);
    };
    const whole = parse(stream);
    const wrong = [];
    for (let i = 0; i <= stream.length; i++) {
        for (let j = i; j <= stream.length; j++) {
            if (parse(stream.slice(0, i), stream.slice(i, j), stream.slice(j)) !== whole) {
                wrong.push([i, j]);
            }
        }
    }
    return { frames: JSON.parse(whole), wrong: wrong.slice(0, 5) };
}"""


def test_the_page_reads_sse_frames_cut_anywhere(gateway: Gateway, page: Page) -> None:
    """The page's own parser: a frame split across chunks at any two places, LF, CRLF or
    CR line ends, comments, and a data field on several lines."""
    page.goto(gateway.url)
    stream = (
        'id: 1\r\nevent: token\r\ndata: {"seq":1}\r\n\r\n'
        ": keep-alive\n\n"
        "id: 2\revent: step\rdata: one\rdata: two\r\r"
        ":comment\r\ndata:three\n\n"
    )
    checked = page.evaluate(SPLIT_CHECK, stream)
    assert checked["wrong"] == []
    assert checked["frames"] == [
        {"id": "1", "type": "token", "data": '{"seq":1}'},
        {"id": "2", "type": "step", "data": "one\ntwo"},
        {"id": "2", "type": "message", "data": "three"},
    ]


EVENT_SOURCE_READ = """async (token) => {
    const headers = { Authorization: `Bearer ${token}`, "Content-Type": "application/json" };
    const post = async (path, body) =>
        (await fetch(path, { method: "POST", headers, body: JSON.stringify(body) })).json();
    const session = await post("/v1/sessions", {});
    const turn = await post(`/v1/sessions/${session.id}/turns`, { prompt: "pause a while" });
    return await new Promise((resolve) => {
        const source = new EventSource(`/v1/turns/${turn.turn_id}/events`);
        const read = { text: "", errors: 0, tokenTimes: [] };
        source.addEventListener("token", (message) => {
            read.tokenTimes.push(performance.now());
            read.text += JSON.parse(message.data).data.text;
        });
        source.addEventListener("end", (message) => {
            source.close();
            resolve({ ...read, outcome: JSON.parse(message.data).data.outcome });
        });
        source.onerror = () => { read.errors += 1; };
    });
}"""


def test_an_event_source_reads_a_stream_silent_for_longer_than_the_keep_alive(
    gateway: Gateway, page: Page
) -> None:
    """The browser's own ``EventSource`` on the native stream (docs/http.md#7-the-event-stream),
    across a turn quiet mid-text for several keep-alives: it reads to the end, once,
    without an error or a reconnect.  (An ``EventSource`` cannot send a token: the test's
    route adds the header its request lacks.)"""
    page.goto(gateway.url)

    def with_token(route: Route) -> None:
        route.continue_(
            headers={**route.request.headers, "authorization": f"Bearer {gateway.token}"}
        )

    page.route(re.compile(r".*/v1/turns/[^/]+/events$"), with_token)
    read = page.evaluate(EVENT_SOURCE_READ, gateway.token)
    assert read["errors"] == 0
    assert (read["outcome"], read["text"]) == ("finished", PAUSED_REPLY)
    first, last = read["tokenTimes"][0], read["tokenTimes"][-1]
    assert last - first >= KEEPALIVE_SECONDS * 5000 * 0.9  # the silence was there


PAGE_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def test_replies_show_as_markdown_with_nothing_in_them_that_runs(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "markdown")
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    answer = page.goto(gateway.url)
    assert answer is not None and answer.headers["content-security-policy"] == PAGE_POLICY
    send(page, "show me some markdown")
    reply = turns(page).nth(0).locator(".agent-body")
    expect(turns(page).nth(0).locator(".badge")).to_have_text("finished")
    for body in (reply, None):
        if body is None:  # and the same once read back from the store
            page.reload()
            body = turns(page).nth(0).locator(".agent-body")
        expect(body.locator("h1")).to_have_text("Plan")
        expect(body.locator("strong")).to_have_text("bold")
        expect(body.locator("em")).to_have_text("slanted")
        expect(body.locator(":not(pre) > code")).to_have_text("inline code")
        expect(body.locator("ul > li")).to_have_text(["first", "second"])
        code = body.locator("pre > code.language-python")
        expect(code).to_have_text("print('hi')  # <b>not bold</b>")
        link = body.get_by_role("link", name="link", exact=True)
        expect(link).to_have_attribute("href", "https://example.com/docs")
        expect(link).to_have_attribute("target", "_blank")
        expect(link).to_have_attribute("rel", "noopener noreferrer")
        # A javascript: address loses its href; an image becomes a link to it.
        assert body.locator("a", has_text="a script").get_attribute("href") is None
        picture = body.get_by_role("link", name="a picture")
        expect(picture).to_have_attribute("href", "https://example.com/p.png")
        expect(body.locator("table td")).to_have_text(["1", "2"])
        # Raw HTML is shown as its text, and none of it is an element or ran.
        expect(body).to_contain_text("<script>window.ran = 1</script>")
        assert page.locator("#turns script, #turns img, #turns b, #turns [onerror]").count() == 0
        assert page.evaluate("window.ran") is None
        shot(page, "rendered")
    assert console_errors == []


def test_a_resumed_turn_that_ended_is_never_shown_running_nor_steered(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    """A refresh whose reads straddle the end (they answer 'running', and arrive after
    the end is on screen) leaves the turn ended, the box a message box."""
    shot = Shots(tmp_path, "resume-race")
    page.goto(gateway.url)
    send(page, "another slow story")
    turn = turns(page).nth(0)
    expect(turn.locator(".step .text").first).to_contain_text("Here is a slow")
    page.get_by_role("button", name="Interrupt").click()
    expect(turn.locator(".badge")).to_have_text("cancelled")
    sid = session_id(page)
    turn.get_by_role("button", name="Resume").click()
    expect(turn.locator(".badge")).to_have_text("running")
    # What the store said while the resumed turn ran: served to every later refresh.
    stale = {
        "tree": gateway.get(f"/v1/sessions/{sid}/tree"),
        "history": gateway.get(f"/v1/sessions/{sid}/history"),
    }
    assert any(t["status"] in ("queued", "running") for t in stale["tree"]["turns"]), stale
    served: list[str] = []

    def answer_stale(route: Route) -> None:
        which = urlsplit(route.request.url).path.rsplit("/", 1)[1]
        served.append(which)
        route.fulfill(status=200, json=stale[which])

    page.route(re.compile(r"/v1/sessions/[^/]+/(tree|history)$"), answer_stale)
    expect(turn).to_contain_text('Latest word from you: "another slow story". The end.')
    for _ in range(100):  # the refresh the end asks for
        if {"tree", "history"} <= set(served):
            break
        page.wait_for_timeout(100)
    assert {"tree", "history"} <= set(served), served
    page.wait_for_timeout(1500)  # time for whatever the stale answers would set off
    expect(turn.locator(".badge")).to_have_text("finished")
    expect(page.locator("#live-state")).to_have_text("")
    expect(page.locator("#mode-pill")).to_be_hidden()
    expect(turn.locator(".typing")).to_have_count(0)
    shot(page, "ended")
    page.unroute(re.compile(r"/v1/sessions/[^/]+/(tree|history)$"))

    steers: list[str] = []
    page.on("request", lambda r: steers.append(r.url) if r.url.endswith("/say") else None)
    send(page, "and after that?")
    after = turns(page).nth(1)
    expect(after.locator(".agent-body")).to_contain_text("You said: and after that?")
    expect(after.locator(".badge")).to_have_text("finished")
    assert steers == []
    expect(turn.locator(".badge")).to_have_text("finished")
    shot(page, "next-turn")


def test_a_turn_waiting_for_capacity_shows_so_then_streams_when_it_goes_on(
    limited_gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    """A turn whose model call must wait for its provider's capacity lets its worker go
    (docs/admission.md#admission-before-every-model-call): the page shows it waiting for
    capacity, with the model and about how long, not hung and not taken over by another
    worker when it goes on; a reload while it waits shows the same."""
    shot = Shots(tmp_path, "throttled")
    page.goto(limited_gateway.url)
    send(page, "first")  # the one call the bucket holds
    first = turns(page).nth(0)
    expect(first.locator(".badge")).to_have_text("finished")

    send(page, "second")
    second = turns(page).nth(1)
    expect(second.locator(".badge")).to_have_text("waiting for capacity")
    note = second.locator(".turn-note")
    expect(note).to_have_text(re.compile(r"^waiting for scripted's capacity, about [1-9]\d* s$"))
    # Unfinished all the same: the box steers it, and Interrupt stops it without waiting.
    expect(page.get_by_role("button", name="Interrupt")).to_be_visible()
    expect(second.locator(".typing")).to_have_count(0)
    shot(page, "waiting")
    expect(second.locator(".agent-body")).to_contain_text("You said: second")
    expect(second.locator(".badge")).to_have_text("finished")
    expect(note).to_be_hidden()
    expect(second).not_to_contain_text("another worker took over")
    shot(page, "went-on")

    # A reload while a turn waits: read from its start, it is shown waiting, then goes on.
    send(page, "third")
    third = turns(page).nth(2)
    expect(third.locator(".badge")).to_have_text("waiting for capacity")
    page.reload()
    third = turns(page).nth(2)
    expect(third.locator(".badge")).to_have_text("waiting for capacity")
    expect(third.locator(".turn-note")).to_contain_text("waiting for scripted's capacity")
    shot(page, "reloaded-waiting")
    expect(third.locator(".agent-body")).to_contain_text("You said: third")
    expect(third.locator(".badge")).to_have_text("finished")
    page.reload()  # and once it ended, read again from its start
    expect(turns(page)).to_have_count(3)
    expect(turns(page).nth(2).locator(".agent-body")).to_contain_text("You said: third")
    expect(page.locator("#turns")).not_to_contain_text("another worker took over")
    shot(page, "ended")


def test_a_delayed_turn_shows_until_when_it_waits_then_runs(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    """A turn submitted with ``after`` (docs/time.md#what-an-operator-sees) is shown
    waiting until its time, in the conversation and the tree, then runs by itself."""
    shot = Shots(tmp_path, "delayed")
    page.goto(gateway.url)
    send(page, "first")
    expect(turns(page).nth(0).locator(".badge")).to_have_text("finished")
    created = httpx.post(
        f"{gateway.base}/v1/sessions/{session_id(page)}/turns",
        headers={"Authorization": f"Bearer {gateway.token}"},
        json={"prompt": "later", "after": 6},
    )
    assert created.status_code == 202, created.text
    page.reload()
    later = turns(page).nth(1)
    expect(later.locator(".badge")).to_have_text(re.compile(r"^waiting until \S.*\d"))
    shot(page, "waiting")
    expect(later.locator(".agent-body")).to_contain_text("You said: later", timeout=30_000)
    expect(later.locator(".badge")).to_have_text("finished")
    shot(page, "ran")


def test_a_turn_waiting_for_an_event_shows_which_and_until_when_then_goes_on(
    waiting_gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    """A turn whose call waits for an event (docs/time.md#what-an-operator-sees-of-a-wait)
    is shown waiting for it, with until when, and goes on once it is signalled."""
    shot = Shots(tmp_path, "event")
    gateway = waiting_gateway
    page.goto(gateway.url)
    send(page, "await the approval")
    waiting = turns(page).nth(0)
    expect(waiting.locator(".badge")).to_have_text(
        re.compile(r"^waiting for event approved \(until \S.*\d.*\)$")
    )
    shot(page, "waiting")
    [turn] = gateway.call("GET", f"/v1/sessions/{session_id(page)}/tree")["turns"]
    sent = gateway.call("POST", f"/v1/turns/{turn['turn_id']}/signals", {"name": "approved"})
    assert sent["delivered"] is True
    expect(waiting.locator(".badge")).to_have_text("finished", timeout=30_000)
    expect(waiting).to_contain_text("Finance answered.")
    shot(page, "went on")


def test_titles_the_head_mark_banners_and_the_offline_agents_files(
    offline_gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    gateway = offline_gateway
    shot = Shots(tmp_path, "titles")
    page.goto(gateway.url)
    empty = page.locator("#empty-state")
    expect(empty).to_contain_text("offline scripted agent")
    shot(page, "empty")

    # A suggestion sends itself; the offline agent finds the sample files.
    empty.get_by_role("button", name="Look around the files").click()
    first = turns(page).nth(0)
    expect(first.locator(".badge")).to_have_text("finished")
    first.locator(".tool summary").click()
    result = first.locator(".tool pre").last
    for name in ("README.md", "retry.py", "config.toml", "notes"):
        expect(result).to_contain_text(name)
    sid = session_id(page)
    expect(page.locator("#session-title")).to_have_text("Look around the files")
    current = page.locator("#session-list .session-item.current .session-name")
    expect(current).to_have_text("Look around the files")

    # A session this tab never opened shows its first prompt, not its id.
    other = gateway.call("POST", "/v1/sessions", {})
    gateway.call("POST", f"/v1/sessions/{other['id']}/turns", {"prompt": "What is in\nconfig?"})
    gateway.call("PATCH", f"/v1/sessions/{sid}", {"title": "Files, renamed"})
    page.reload()
    names = page.locator("#session-list .session-name")
    expect(names).to_have_text(["What is in config?", "Files, renamed"])
    expect(page.locator("#session-title")).to_have_text("Files, renamed")
    assert page.title() == "Files, renamed · parley"
    shot(page, "listed")

    # The head mark moves to a turn when it starts (the next message follows it).
    send(page, "tell me a slow story")
    story = turns(page).nth(1)
    head = page.locator("#tree .node-row.head")
    expect(head).to_contain_text("tell me a slow story")
    assert story.locator(".badge").inner_text() == "running"
    expect(story.locator(".is-head, .badge")).to_have_count(1)
    shot(page, "head-moved")
    expect(story.locator(".badge")).to_have_text("finished")

    # A banner takes its own room: the conversation starts below it.
    failure = {"error": {"type": "Unavailable", "message": "try again later"}}
    page.route("**/v1/sessions/*/branch", lambda route: route.fulfill(status=503, json=failure))
    first.get_by_role("button", name="Branch from here").click()
    banner = page.locator(".banner")
    expect(banner).to_contain_text("Could not branch")
    below = page.locator("#conversation").bounding_box()
    above = banner.bounding_box()
    assert below is not None and above is not None
    assert above["y"] + above["height"] <= below["y"] + 1, (above, below)
    shot(page, "banner")


def test_approve_deny_an_undelivered_steer_sent_again_and_an_older_turns_steps(
    asking_gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    """The controls of a turn that no other test clicks, each reported by the turn's view
    to the page: Approve and Deny on a call that waits (the first runs it, the second
    tells the model no), "Send as a new message" under a steer the turn stopped before
    taking, and "Show steps" of a turn older than the three a session opens with."""
    shot = Shots(tmp_path, "controls")
    control = Control(tmp_path / "ws" / "local" / "any")
    page.goto(asking_gateway.url)
    send(page, "record this")
    approved = turns(page).nth(0)
    card = approved.locator(".approval")
    expect(card).to_contain_text("Approval needed: record_call")
    expect(approved.locator(".badge")).to_have_text("waiting for approval")
    assert control.recorded_notes() == []
    shot(page, "waiting")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".approval-status")).to_have_text("✓ approved")
    expect(approved.locator(".badge")).to_have_text("finished")
    expect(approved).to_contain_text("Asked, and answered.")
    assert control.recorded_notes() == ["from the page"]

    send(page, "record that")
    denied = turns(page).nth(1)
    denied.locator(".approval").get_by_role("button", name="Deny").click()
    expect(denied.locator(".approval-status")).to_have_text("✗ denied")
    expect(denied.locator(".refusal")).to_contain_text("Refused record_call by approval")
    expect(denied.locator(".badge")).to_have_text("finished")
    assert control.recorded_notes() == ["from the page"]
    shot(page, "answered")

    # A steer the turn never took (interrupted first) is offered as a new message.
    send(page, "linger a while")
    lingering = turns(page).nth(2)
    expect(lingering.locator(".step .text").first).to_contain_text("w w")
    send(page, "one more thing")
    expect(lingering.locator(".steer-row.pending")).to_contain_text("one more thing")
    page.get_by_role("button", name="Interrupt").click()
    expect(lingering.locator(".badge")).to_have_text("cancelled")
    undelivered = lingering.locator(".steer-row.undelivered")
    expect(undelivered).to_contain_text("one more thing")
    undelivered.get_by_role("button", name="Send as a new message").click()
    expect(undelivered.get_by_role("button", name="Send as a new message")).to_have_count(0)
    again = turns(page).nth(3)
    expect(again.locator(".bubble.user")).to_have_text("one more thing")
    expect(again.locator(".agent-body")).to_contain_text("You said: one more thing")
    expect(again.locator(".badge")).to_have_text("finished")
    shot(page, "sent-again")

    # Opened again, the three newest turns show their steps; the first, its reply.
    page.reload()
    expect(turns(page)).to_have_count(4)
    first = turns(page).nth(0)
    expect(first.locator(".agent-body")).to_have_text("Asked, and answered.")
    expect(turns(page).nth(1).locator(".tool")).to_have_count(1)
    first.get_by_role("button", name="Show steps").click()
    expect(first.locator(".tool .tool-name")).to_have_text("record_call")
    expect(first.locator(".tool-state")).to_have_text("done")
    expect(first.get_by_role("button", name="Show steps")).to_have_count(0)
    shot(page, "steps-shown")


def submit_batch(gateway: Gateway, prompts: list[str], *, broken: bool = False) -> str:
    """A batch through the gateway (upload, then create), as the openai client makes one."""
    rows = [
        json.dumps(
            {"custom_id": f"c{n}", "method": "POST", "url": "/v1/responses", "body": {"input": p}}
        )
        for n, p in enumerate(prompts)
    ]
    if broken:
        rows.append("{not json")
    headers = {"Authorization": f"Bearer {gateway.token}"}
    files = {"file": ("lines.jsonl", ("\n".join(rows) + "\n").encode())}
    upload = httpx.post(
        f"{gateway.base}/v1/files", headers=headers, files=files, data={"purpose": "batch"}
    )
    assert upload.status_code == 200, upload.text
    body = {
        "input_file_id": upload.json()["id"],
        "endpoint": "/v1/responses",
        "completion_window": "24h",
    }
    created = httpx.post(f"{gateway.base}/v1/batches", headers=headers, json=body)
    assert created.status_code == 200, created.text
    batch_id: str = created.json()["id"]
    return batch_id


def test_the_page_lists_the_batches_and_a_line_opens_as_its_session(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "batches")
    submit_batch(gateway, [f"tell me a slow story {n}" for n in range(3)])
    quick = submit_batch(gateway, [f"ticket {n}" for n in range(4)], broken=True)
    page.goto(gateway.url)

    section = page.locator("#batches-section")
    expect(section).to_be_visible()
    items = page.locator("#batch-list .batch-item")
    expect(items).to_have_count(2)
    # Newest first; the quick batch's counts reach its end, its bad line failed.
    first = items.nth(0)
    expect(first).to_contain_text(f"Batch {quick.removeprefix('batch_')[:8]}")
    expect(first.locator(".batch-counts")).to_contain_text(
        "5/5 · 4 done · 1 failed", timeout=30_000
    )
    expect(first.locator(".batch-status")).to_have_text("completed")
    expect(items.nth(1).locator(".batch-status")).to_have_text("in progress")
    expect(items.nth(1).locator(".batch-counts")).to_contain_text("running")
    shot(page, "list")

    first.click()
    expect(first).to_have_attribute("aria-expanded", "true")
    lines = page.locator("#batch-list .batch.open .batch-line")
    expect(lines).to_have_count(5)
    expect(lines.nth(4)).to_contain_text("invalid_json")
    shot(page, "lines")
    lines.nth(2).click()
    expect(turns(page).nth(0).locator(".agent-body")).to_contain_text("You said: ticket 2")
    expect(page.locator("#session-title")).to_contain_text("ticket 2")
    shot(page, "line-session")
    # The slow batch ends on the page by itself.
    expect(items.nth(1).locator(".batch-status")).to_have_text("completed", timeout=60_000)
    expect(items.nth(1).locator(".batch-counts")).to_contain_text("3/3 · 3 done")


COUNTS_SEEN = """() => {
  // Every text a batch's counts showed, in order (the page replaces the list's elements).
  window.countsSeen = [];
  const list = document.getElementById("batch-list");
  const note = () => {
    const text = list.querySelector(".batch-counts")?.textContent;
    if (text && window.countsSeen.at(-1) !== text) window.countsSeen.push(text);
  };
  new MutationObserver(note).observe(list, { childList: true, subtree: true });
}"""


def test_a_cli_batch_appears_live_grouped_and_a_reload_opens_the_conversation(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "cli-batch")
    page.goto(gateway.url)
    # No batch yet: no Batches heading over nothing (nor a Tree one before a session).
    expect(page.locator("#sessions-empty")).to_be_visible()
    expect(page.locator("#batches-section")).to_be_hidden()
    expect(page.locator("#tree-section")).to_be_hidden()
    shot(page, "no-batches")
    send(page, "hello")
    expect(turns(page).nth(0).locator(".agent-body")).to_contain_text("You said: hello")
    conversation = session_id(page)
    expect(page.locator("#batches-section")).to_be_hidden()
    page.evaluate(COUNTS_SEEN)

    # The command line's batch on the gateway's database, its lines one at a time.
    lines = tmp_path / "lines.jsonl"
    rows = [
        {"custom_id": f"c{n}", "method": "POST", "url": "/v1/responses", "body": {"input": p}}
        for n, p in enumerate(["count sheep", "count stars", "count again"])
    ]
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_WORKSPACES": str(tmp_path / "ws"),
        "PARLEY_BATCH_WINDOW": "1",
        "PYTHONPATH": str(REPO),
    }
    db = f"sqlite:///{tmp_path / 'p.db'}"
    script = f"scripted:{tmp_path / 'script.json'}"
    command = [sys.executable, "-m", "parley", "--db", db, "--host", script, "batch", "submit"]
    cli = subprocess.Popen(
        [*command, str(lines)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        # It appears without a reload, running, grouped: its sessions are under it, not
        # among the conversations.
        batch = page.locator("#batch-list .batch-item")
        expect(batch).to_have_count(1)
        expect(batch.locator(".batch-status")).to_have_text("in progress")
        expect(page.locator("#session-list .session-item")).to_have_count(1)
        shot(page, "appeared")
        batch.click()
        line_items = page.locator("#batch-list .batch.open .batch-line")
        expect(line_items).to_have_count(3)
        expect(line_items.nth(0)).to_contain_text("c0")
        shot(page, "lines")

        # Its counts move as its lines end; the lines' statuses with them.
        expect(batch.locator(".batch-status")).to_have_text("completed", timeout=90_000)
        expect(batch.locator(".batch-counts")).to_have_text("3/3 · 3 done")
        expect(line_items.nth(2).locator(".line-status")).to_have_text("finished")
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 0, stderr
    batch_id = stdout.splitlines()[0]
    expect(batch).to_contain_text(f"Batch {batch_id.removeprefix('batch_')[:8]}")
    seen: list[str] = page.evaluate("window.countsSeen")
    ended = [int(text.split("/")[0]) for text in seen]
    assert ended == sorted(ended) and ended[0] < 3 and seen[-1] == "3/3 · 3 done", seen
    assert len(seen) >= 2, seen  # shown while it ran, then as it ended
    shot(page, "completed")

    # A line opens as its session, marked in its batch; the list of conversations keeps
    # to conversations.
    line_items.nth(1).click()
    expect(turns(page).nth(0).locator(".agent-body")).to_contain_text("w120")
    expect(page.locator("#session-sub")).to_contain_text("a line of batch")
    expect(page.locator("#batch-list .batch-line.current")).to_contain_text("c1")
    expect(page.locator("#session-list .session-item")).to_have_count(1)
    expect(page.locator("#session-list .session-item.current")).to_have_count(0)
    shot(page, "line-session")

    # Opened without a session in its URL, the page shows the newest conversation, not
    # one of the batch's newer sessions.
    page.goto(gateway.base + "/")
    expect(page.locator("#session-title")).to_have_text("hello")
    assert session_id(page) == conversation
    expect(turns(page).nth(0).locator(".agent-body")).to_contain_text("You said: hello")
    expect(page.locator("#batch-list .batch-item")).to_have_count(1)
    shot(page, "reloaded")

    # A session made elsewhere (the API, another tab) appears without a reload.
    gateway.call("POST", "/v1/sessions", {"title": "Made elsewhere"})
    names = page.locator("#session-list .session-name")
    expect(names).to_have_text(["Made elsewhere", "hello"])
    shot(page, "made-elsewhere")


def test_the_lines_of_a_long_batch_keep_up_past_the_first_hundred(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "long-batch")
    batch_id = submit_batch(gateway, [f"ticket {n}" for n in range(110)] + ["linger"])
    page.goto(gateway.url)
    page.locator("#batch-list .batch-item").click()
    lines = page.locator("#batch-list .batch.open .batch-line")
    expect(lines).to_have_count(50)
    more = page.get_by_role("button", name="More lines…")
    more.click()
    expect(lines).to_have_count(100)
    more.click()
    expect(lines).to_have_count(111)
    last = lines.nth(110)
    expect(last.locator(".line-status")).to_have_text("running")
    shot(page, "running")

    # Stopped elsewhere, the last line shows it: every page shown is read again.
    gateway.call("POST", f"/v1/batches/{batch_id}/cancel")
    expect(last.locator(".line-status")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#batch-list .batch-status")).to_have_text("cancelled")
    expect(page.locator(".banner")).to_have_count(0)
    shot(page, "cancelled")


def test_a_compaction_shows_as_a_divider_with_its_text_folded(
    gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "compaction")
    page.goto(gateway.url)
    for n, text in enumerate(("first <b>words</b>", "second", "third")):
        send(page, text)
        expect(turns(page).nth(n).locator(".badge")).to_have_text("finished")
    sid = session_id(page)
    made = gateway.call(
        "POST", f"/v1/sessions/{sid}/compact", {"strategy": "summarize", "keep_turns": 1}
    )
    page.reload()
    divider = page.locator("#turns > li.compaction-divider")
    expect(divider).to_have_count(1)
    # Under the newest turn it covers (the second), before the turn kept whole.
    placed = page.locator("#turns > li").evaluate_all(
        "els => els.map(el => el.classList.contains('compaction-divider') ? 'divider' : 'turn')"
    )
    assert placed == ["turn", "turn", "divider", "turn"]
    expect(divider).to_contain_text("Compacted (summarize)")
    expect(divider).to_contain_text(f"{made['tokens_before']} → {made['tokens_after']} tokens")
    folded = divider.locator(".compaction-text")
    expect(folded).to_be_hidden()  # folded until asked for
    divider.locator("summary").click()
    expect(folded).to_be_visible()
    expect(folded).to_have_text(made["text"])  # the summary, as text: no markup runs
    assert page.locator("#turns b").count() == 0
    expect(turns(page)).to_have_count(3)  # the turns it covers stay on the page
    shot(page, "divider-open")

    gateway.call("DELETE", f"/v1/sessions/{sid}/compactions/{made['id']}")
    page.reload()
    expect(turns(page)).to_have_count(3)
    expect(page.locator("#turns > li.compaction-divider")).to_have_count(0)


def test_a_turn_that_compacts_first_shows_the_divider_while_it_runs(
    compacting_gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    shot = Shots(tmp_path, "compacting")
    page.goto(compacting_gateway.url)
    for n, text in enumerate(("big one", "big two")):
        send(page, text)
        expect(turns(page).nth(n).locator(".badge")).to_have_text("finished", timeout=20_000)
    expect(page.locator("#turns > li.compaction-divider")).to_have_count(0)
    send(page, "slow three")  # its first request passes the threshold: it compacts first
    third = turns(page).nth(2)
    divider = page.locator("#turns > li.compaction-divider")
    expect(divider).to_have_count(1, timeout=10_000)
    expect(third.locator(".badge")).to_have_text("running")  # shown while the turn runs
    expect(divider).to_contain_text("Compacted (summarize)")
    placed = page.locator("#turns > li").evaluate_all(
        "els => els.map(el => el.classList.contains('compaction-divider') ? 'divider' : 'turn')"
    )
    assert placed == ["turn", "divider", "turn", "turn"]  # under the first: one kept whole
    shot(page, "while-running")
    expect(third.locator(".badge")).to_have_text("finished", timeout=30_000)
    [made] = compacting_gateway.get(f"/v1/sessions/{session_id(page)}/compactions")["compactions"]
    assert made["made_by_turn_id"] == third.get_attribute("data-turn-id")


def agent_text(card: Locator) -> str:
    text: str = card.locator(".agent-texts").evaluate("el => el.textContent")
    return text


def test_children_stream_at_once_as_cards_inside_their_parents_step(
    agents_gateway: Gateway, page: Page, tmp_path: Path
) -> None:
    """docs/sub-agents.md#7-seen: each child turn is a card under its agent call, in the
    parent's step, with its agent, status and session link, its text growing live; a
    stream cut mid-fan-out resumes from its cursor with nothing shown twice."""
    shot = Shots(tmp_path, "agents")
    cursors: list[str | None] = []

    def cut_first_stream(route: Route) -> None:
        """The first tree stream is cut once both children have streamed some words."""
        headers = route.request.headers
        cursors.append(headers.get("last-event-id"))
        assert parse_qs(urlsplit(route.request.url).query).get("children") == ["1"]
        if len(cursors) > 1:
            route.continue_()
            return
        upstream = urllib.request.Request(
            gateway_url(route), headers={"Authorization": f"Bearer {agents_gateway.token}"}
        )
        body = ""
        with urllib.request.urlopen(upstream, timeout=30) as stream:
            while body.count('"path":[{') < 24:  # a few words of each child
                line = stream.readline().decode()
                assert line, "the stream ended before the cut"
                body += line
            while not body.endswith("\n\n"):
                body += stream.readline().decode()
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    def gateway_url(route: Route) -> str:
        return agents_gateway.base + urlsplit(route.request.url).path + "?children=1"

    page.route(re.compile(r"/v1/turns/[^/]+/events"), cut_first_stream)
    page.goto(agents_gateway.url)
    send(page, "fan out over two topics")
    turn = turns(page).nth(0)
    cards = turn.locator(".step[data-step='0'] .tools > .agent-card")
    expect(cards).to_have_count(2)
    alpha, beta = cards.nth(0), cards.nth(1)
    # Each card takes its call's place in the step, names its agent and task.
    for card, task in ((alpha, "topic alpha"), (beta, "topic beta")):
        expect(card.locator(".agent-name")).to_have_text("researcher")
        expect(card.locator(".agent-task")).to_have_text(task)
        call = card.locator("xpath=preceding-sibling::*[1]")
        expect(call).to_have_attribute("data-call-id", str(card.get_attribute("data-call-id")))
        expect(call).to_be_hidden()
    expect(alpha.locator(".tool-state")).to_have_text("running")
    expect(beta.locator(".tool-state")).to_have_text("running")
    # The parent's step waits for them, holding nothing: it says so, with no typing dots.
    expect(turn.locator(".badge")).to_have_text("waiting for agents")
    expect(turn.locator(".typing")).to_have_count(0)
    # Both grow at the same time: each shows more while the other has not finished.
    expect(alpha.locator(".agent-texts")).to_contain_text("c10")
    expect(beta.locator(".agent-texts")).to_contain_text("c10")
    first = (agent_text(alpha), agent_text(beta))
    shot(page, "both-streaming")
    expect(alpha.locator(".agent-texts")).to_contain_text(_word_after(first[0], 8))
    expect(beta.locator(".agent-texts")).to_contain_text(_word_after(first[1], 8))
    assert "c80" not in agent_text(alpha) and "c80" not in agent_text(beta), "not at once"
    assert len(cursors) >= 2 and cursors[0] is None and cursors[1], cursors
    # Every word once, in order, across the cut.
    for card, topic in ((alpha, "alpha"), (beta, "beta")):
        shown = agent_text(card).strip()
        assert f"On topic {topic}: {CHILD_WORDS}".startswith(shown), shown
    shot(page, "both-grown")
    # A reload while they stream shows them again, live, from the tree's start.
    page.reload()
    turn = turns(page).nth(0)
    expect(turn.locator(".badge")).to_have_text("waiting for agents")
    expect(cards).to_have_count(2)
    alpha, beta = cards.nth(0), cards.nth(1)
    expect(alpha.locator(".agent-texts")).to_contain_text(_word_after(agent_text(alpha), 4))
    expect(beta.locator(".agent-texts")).to_contain_text(_word_after(agent_text(beta), 4))
    shot(page, "reloaded")
    expect(turn.locator(".badge")).to_have_text("finished", timeout=30_000)
    for card, topic in ((alpha, "alpha"), (beta, "beta")):
        expect(card.locator(".tool-state")).to_have_text("finished")
        assert agent_text(card).strip() == f"On topic {topic}: {CHILD_WORDS}".strip()
    expect(turn.locator(".step[data-step='1'] .text")).to_have_text("Both reported back.")
    # Going on after its children is no takeover: no divider says another worker took over.
    expect(turn.locator(".note-divider")).to_have_count(0)
    shot(page, "finished")
    # Each card links to its child's own session, which opens as a conversation.
    details = agents_gateway.get(f"/v1/turns/{turn.get_attribute('data-turn-id')}")
    children = {c["call_id"]: c for c in details["children"]}
    for card in (alpha, beta):
        child = children[str(card.get_attribute("data-call-id"))]
        assert card.get_attribute("data-turn-id") == child["turn_id"]
        href = card.locator(".agent-link").get_attribute("href")
        assert href == f"#s={child['session_id']}"
    alpha.locator(".agent-link").click()
    expect(page).to_have_url(re.compile(f"#s={children['call_0_0']['session_id']}$"))
    expect(turns(page)).to_have_count(1)
    expect(turns(page).nth(0).locator(".bubble.user")).to_have_text("topic alpha")
    shot(page, "child-session")


def _word_after(text: str, ahead: int) -> str:
    """The word ``ahead`` words past the last whole one of ``text`` in :data:`CHILD_WORDS`."""
    words = CHILD_WORDS.split()
    shown = [w for w in text.split() if w in words]
    return words[min(len(words) - 1, words.index(shown[-1]) + ahead)]


def test_the_page_lists_the_tenants_schedules_with_their_next_slot(
    gateway: Gateway, page: Page
) -> None:
    headers = {"Authorization": f"Bearer {gateway.token}"}

    def schedule(**body: Any) -> dict[str, Any]:
        made = httpx.post(f"{gateway.base}/v1/schedules", headers=headers, json=body)
        assert made.status_code == 201, made.text
        answer: dict[str, Any] = made.json()
        return answer

    page.goto(gateway.url)
    expect(page.locator("#schedules-section")).to_be_hidden()
    schedule(
        cron="0 9 * * 1-5", prompt="summarise tickets", timezone="Europe/Paris", name="Tickets"
    )
    paused = schedule(cron="*/5 * * * *", prompt="check the queue")
    httpx.patch(
        f"{gateway.base}/v1/schedules/{paused['id']}", headers=headers, json={"paused": True}
    )
    # Made elsewhere: the sidebar's watch shows them without a reload.
    items = page.locator("#schedule-list .schedule")
    expect(items).to_have_count(2, timeout=15_000)
    expect(page.locator("#schedules-section")).to_be_visible()
    expect(items.nth(0)).to_contain_text("Tickets")
    expect(items.nth(0).locator(".schedule-cron")).to_have_text("0 9 * * 1-5 · Europe/Paris")
    expect(items.nth(0).locator(".schedule-next")).to_contain_text("next ")
    expect(items.nth(1)).to_contain_text("check the queue")
    expect(items.nth(1).locator(".schedule-next")).to_have_text("paused")
