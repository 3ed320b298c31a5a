"""The gateway's web page in a real browser (Chromium, driven by Playwright): a real
``parley gateway`` process on loopback with a scripted model, opened with the URL it
prints.  A message streams its reply; the same box steers a running turn and the model
hears it; Interrupt cancels and Resume finishes; "Branch from here" moves the head and a
new turn hangs under the earlier one; a reload keeps the conversation, and picks up a
turn that is still running; a stream cut mid-turn reconnects with nothing shown twice;
and the browser's own ``EventSource`` reads the native stream across a silence longer
than the keep-alive.

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
    requests: list[int] = []

    def cut_first_streams(route: Route) -> None:
        """The first stream is cut off mid-turn (in the middle of a frame, after a word of
        the long step), the second fails outright; later ones reach the gateway."""
        after = int(parse_qs(urlsplit(route.request.url).query).get("after", ["0"])[0])
        requests.append(after)
        if len(requests) == 2:
            route.abort("connectionreset")
            return
        if len(requests) > 2:
            route.continue_()
            return
        upstream = urllib.request.Request(
            gateway.base + urlsplit(route.request.url).path + f"?after={after}",
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
    assert len(requests) >= 3 and requests[0] == 0
    assert requests[1] > 0 and requests[2] == requests[1], requests
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
