// parley's web page: sessions, a session's tree, the conversation root → head, and the
// running turn streamed live.  Plain ES module, no build step.  Every piece of model or
// user text goes into the page as a text node (never as markup), except the agent's
// replies: Markdown, rendered and sanitized by markdown.js.

import { renderMarkdown } from "./markdown.js";

const TOKEN_KEY = "parley.token";
const TERMINAL = new Set([
  "finished", "succeeded", "check_failed", "budget_exceeded", "cancelled", "failed",
]);
const RESUMABLE = new Set(["cancelled", "failed"]);
// Elements that hold nothing: the streaming caret never goes into one.
const VOID_TAGS = new Set(["BR", "HR", "INPUT"]);
const STATUS_LABEL = {
  queued: "queued",
  running: "running",
  waiting: "waiting for approval",
  finished: "finished",
  succeeded: "succeeded",
  check_failed: "check failed",
  budget_exceeded: "budget exceeded",
  cancelled: "cancelled",
  failed: "failed",
};
const SESSIONS_PAGE = 50;
// The gateway sends a keep-alive comment at least every 15 s by default: a stream silent
// for much longer than that is dead even if the socket has not said so.
const STALL_MS = 40_000;

// ---------------------------------------------------------------- small DOM helpers

/** An element: h("div", {class: "x", onclick: f}, "text", child, …).  Strings become text
 *  nodes, so nothing passed here is ever parsed as markup. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";
/** A small stroked icon from path data of a 24×24 box. */
function icon(paths, cls = "icon") {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", cls);
  svg.setAttribute("aria-hidden", "true");
  for (const d of paths) {
    const p = document.createElementNS(SVG_NS, "path");
    p.setAttribute("d", d);
    svg.append(p);
  }
  return svg;
}
const ICON_BRANCH = [
  "M6 3v12", "M18 9a3 3 0 1 0 0-6 3 3 0 0 0 0 6z", "M6 21a3 3 0 1 0 0-6 3 3 0 0 0 0 6z",
  "M18 9a9 9 0 0 1-9 9",
];
const ICON_RESUME = ["M5 4l14 8-14 8z"];
const ICON_STOP = ["M6 6h12v12H6z"];
const ICON_STEPS = ["M4 6h16", "M4 12h10", "M4 18h13"];
// Drawn, not emoji: a machine without an emoji font would show empty boxes.
const ICON_REFUSED = ["M12 21a9 9 0 1 0 0-18 9 9 0 0 0 0 18z", "M5.7 5.7l12.6 12.6"];
const ICON_ASK = [
  "M12 21a9 9 0 1 0 0-18 9 9 0 0 0 0 18z", "M9.5 9.5a2.5 2.5 0 1 1 3.5 2.3c-.6.3-1 .9-1 1.6v.6",
  "M12 17.5h.01",
];

const $ = (id) => document.getElementById(id);

function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

function when(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  if (s < 7 * 86400) return `${Math.round(s / 86400)} d ago`;
  return new Date(t).toLocaleDateString();
}

function fullTime(iso) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? "" : new Date(t).toLocaleString();
}

function oneLine(text, max = 80) {
  const flat = String(text ?? "").replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// ---------------------------------------------------------------- token and API

/** The token from `?token=` (kept for this tab in sessionStorage and taken out of the
 *  address bar), or the one kept from before. */
function takeToken() {
  const url = new URL(window.location.href);
  const given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    url.searchParams.delete("token");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "NetworkError", "the gateway did not answer (is it running?)");
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (res.status === 401) {
    lock("The gateway did not accept this tab's token.");
    throw new ApiError(401, "Unauthorized", data?.error?.message || "unauthorized");
  }
  if (!res.ok) {
    const e = data && data.error;
    throw new ApiError(res.status, e?.type || `HTTP ${res.status}`, e?.message || res.statusText);
  }
  return { status: res.status, data };
}

// ---------------------------------------------------------------- banners

function banner(message, { kind = "error", timeout = 9000 } = {}) {
  const stack = $("banners");
  // The same message twice in a row is one banner.
  for (const old of stack.children) {
    if (old.dataset.message === message) old.remove();
  }
  const close = h("button", { type: "button", class: "banner-close", "aria-label": "Dismiss" }, "×");
  const el = h("div", { class: `banner ${kind}`, dataset: { message } },
    h("span", { class: "banner-text" }, message), close);
  close.addEventListener("click", () => el.remove());
  stack.append(el);
  while (stack.children.length > 3) stack.firstElementChild.remove();
  if (timeout) setTimeout(() => el.remove(), timeout);
}

function report(err, what) {
  if (err instanceof ApiError && err.status === 401) return; // the lock says it
  const detail = err instanceof ApiError ? `${err.type}: ${err.message}` : String(err?.message || err);
  banner(what ? `${what} — ${detail}` : detail);
}

function lock(detail) {
  state.locked = true;
  for (const follower of state.followers.values()) follower.stop();
  $("lock-detail").textContent = detail || "";
  $("lock").hidden = false;
}

// ---------------------------------------------------------------- SSE

/** Server-sent events parsed from text chunks as they arrive: frames may be split
 *  anywhere, lines end in LF, CRLF or CR, and comment lines (": keep-alive") are not
 *  events.  Follows the WHATWG event-stream interpretation. */
export class SSEParser {
  constructor(onEvent, onComment = () => {}) {
    this.onEvent = onEvent;
    this.onComment = onComment;
    this.buffer = "";
    this.data = [];
    this.type = "";
    this.lastId = "";
  }

  push(chunk) {
    this.buffer += chunk;
    const eol = /\r\n|\r|\n/g;
    let start = 0;
    let match;
    while ((match = eol.exec(this.buffer)) !== null) {
      // A CR at the very end may be the first half of a CRLF split across chunks.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      this.line(this.buffer.slice(start, match.index));
      start = match.index + match[0].length;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === "") {
      this.dispatch();
      return;
    }
    if (line.startsWith(":")) {
      this.onComment(line.slice(1).trim());
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.type = value;
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
  }

  dispatch() {
    const data = this.data;
    const type = this.type || "message";
    this.data = [];
    this.type = "";
    if (data.length === 0) return;
    this.onEvent({ id: this.lastId, type, data: data.join("\n") });
  }
}

/** Follows one turn's event stream with fetch (EventSource cannot send a bearer token):
 *  every event once, in order, from `after` on.  When the connection drops before the
 *  turn's last `end` it reconnects with backoff from the last seq it saw.  `lastKind` is
 *  the kind of the event at `after`: from an `end`, a stream that closes with nothing
 *  new is a turn still ended (not resumed since), not a connection lost. */
class Follower {
  constructor(turnId, after, { lastKind = null, onEvent, onState, onGone }) {
    this.turnId = turnId;
    this.last = after;
    this.lastKind = lastKind;
    this.received = 0;
    this.onEvent = onEvent;
    this.onState = onState;
    this.onGone = onGone;
    this.stopped = false;
    this.done = false;
    this.state = "connecting";
    this.stopper = new AbortController();
    this.wake = null;
    this.promise = this.run();
  }

  stop() {
    this.stopped = true;
    this.stopper.abort();
  }

  /** Skip the rest of a backoff pause (the browser is back online). */
  poke() {
    this.wake?.abort();
  }

  setState(next, detail) {
    this.state = next;
    this.onState(next, detail);
  }

  async run() {
    let failures = 0;
    while (!this.stopped) {
      const attempt = new AbortController();
      const abortAttempt = () => attempt.abort();
      this.stopper.signal.addEventListener("abort", abortAttempt, { once: true });
      let stall = null;
      const feed = () => {
        clearTimeout(stall);
        stall = setTimeout(() => attempt.abort(), STALL_MS);
      };
      let progressed = false;
      try {
        this.setState(failures ? "reconnecting" : "connecting");
        feed();
        const url = `/v1/turns/${encodeURIComponent(this.turnId)}/events?after=${this.last}`;
        const res = await fetch(url, {
          headers: {
            Authorization: `Bearer ${state.token}`,
            Accept: "text/event-stream",
            "Last-Event-ID": String(this.last),
          },
          cache: "no-store",
          signal: attempt.signal,
        });
        if (res.status === 401) {
          lock("The gateway did not accept this tab's token.");
          return;
        }
        if (res.status === 404) {
          this.done = true;
          this.setState("gone");
          this.onGone?.();
          return;
        }
        if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
        this.setState("live");
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        const parser = new SSEParser((frame) => {
          let event;
          try { event = JSON.parse(frame.data); } catch { return; }
          const seq = Number(event.seq ?? frame.id);
          if (!Number.isFinite(seq) || seq <= this.last) return; // seen already
          this.last = seq;
          this.lastKind = event.kind || frame.type;
          this.received += 1;
          progressed = true;
          failures = 0;
          this.onEvent(event);
        });
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          feed();
          parser.push(value);
        }
        if (this.lastKind === "end") {
          this.done = true;
          this.setState("ended");
          return;
        }
        throw new Error("the stream closed before the turn's end");
      } catch (err) {
        if (this.stopped) return;
        failures = progressed ? 1 : failures + 1;
        const pause = Math.min(8000, 400 * 2 ** (failures - 1)) * (0.75 + Math.random() * 0.5);
        this.setState("reconnecting", pause);
        this.wake = new AbortController();
        await sleep(pause, AbortSignal.any
          ? AbortSignal.any([this.stopper.signal, this.wake.signal])
          : this.stopper.signal);
      } finally {
        clearTimeout(stall);
        this.stopper.signal.removeEventListener("abort", abortAttempt);
      }
    }
  }
}

// ---------------------------------------------------------------- one turn on screen

function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return String(text ?? "");
  }
}

function argumentsPreview(text) {
  try {
    const value = JSON.parse(text);
    if (value && typeof value === "object" && !Array.isArray(value)) {
      const parts = Object.entries(value).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
      return oneLine(parts.join(", "), 70);
    }
    return oneLine(JSON.stringify(value), 70);
  } catch {
    return oneLine(text, 70);
  }
}

class TurnView {
  constructor(turn) {
    this.turn = { ...turn };
    this.live = false; // its events are being followed
    this.detailed = false; // its body is the event timeline, not just the reply
    this.lastSeq = 0;
    this.blocks = new Map(); // step index → {el, bubble, textEl, tools, committed, source}
    this.unrendered = new Set(); // blocks whose source changed since they were rendered
    this.calls = new Map(); // call_id → tool card
    this.approvals = new Map(); // approval_id → card
    this.pendingSteers = [];
    this.current = null;

    this.badge = h("span", { class: "badge" });
    this.note = h("span", { class: "turn-note", "aria-live": "polite" });
    this.when = h("time", { class: "turn-time" });
    this.actions = h("div", { class: "turn-actions" });
    this.body = h("div", { class: "agent-body" });
    this.caret = h("span", { class: "caret", "aria-hidden": "true" });
    this.typing = h("div", { class: "typing", "aria-label": "the agent is working" },
      h("span"), h("span"), h("span"));
    this.promptEl = h("div", { class: "bubble user" });
    this.el = h("li", { class: "turn", dataset: { turnId: turn.turn_id } },
      h("div", { class: "row user-row" }, this.promptEl),
      h("div", { class: "row agent-row" },
        h("div", { class: "avatar", "aria-hidden": "true" }),
        this.body),
      h("div", { class: "turn-foot" }, this.badge, this.note, this.when, this.actions),
    );
    this.promptEl.textContent = turn.prompt ?? "";
    this.render();
  }

  get status() {
    return this.turn.status;
  }

  get running() {
    return !TERMINAL.has(this.turn.status);
  }

  /** Whether the last event shown is the turn's `end`. */
  get ended() {
    return this.lastKind === "end";
  }

  /** New facts about the turn from the API (ignored while its stream is the truth). */
  update(turn) {
    if (this.live && this.running) return;
    if (this.ended && !TERMINAL.has(turn.status)) {
      // Read before the end on screen (the reads behind a refresh straddled it), or
      // resumed since, elsewhere: either way its stream tells (followActive follows it
      // on from the end), and until it does the turn is shown as it ended.
      turn = { ...turn, status: this.turn.status, reply: this.turn.reply };
    }
    const changed = turn.status !== this.turn.status || turn.reply !== this.turn.reply;
    Object.assign(this.turn, turn);
    if (changed || !this.detailed) this.render();
  }

  setStatus(status) {
    // Replaying a turn that had ended shows its steps, not the statuses it went through.
    if (this.replaying || status === this.turn.status) return;
    this.turn.status = status;
    this.renderFoot();
    onTurnStatus(this);
  }

  render() {
    if (!this.detailed) this.renderSummary();
    this.renderFoot();
  }

  renderSummary() {
    this.body.replaceChildren();
    const t = this.turn;
    if (t.reply) {
      this.body.append(replyBubble(t.reply));
    } else if (this.running) {
      this.body.append(this.typing);
    } else {
      this.body.append(h("div", { class: "bubble agent muted" },
        h("div", { class: "text", text: "No reply." })));
    }
  }

  renderFoot() {
    const t = this.turn;
    this.badge.className = `badge status-${t.status}`;
    this.badge.textContent = STATUS_LABEL[t.status] || t.status || "";
    this.when.textContent = when(t.created_at);
    this.when.title = fullTime(t.created_at);
    if (t.created_at) this.when.dateTime = t.created_at;
    this.actions.replaceChildren();
    if (RESUMABLE.has(t.status)) {
      this.actions.append(h("button", {
        type: "button", class: "chip resume",
        title: "Carry this turn on from its last committed step",
        onclick: () => resumeTurn(this),
      }, icon(ICON_RESUME), "Resume"));
    }
    if (!this.detailed && !this.running) {
      this.actions.append(h("button", {
        type: "button", class: "chip",
        title: "Show this turn's steps, tool calls and steers",
        onclick: () => showSteps(this),
      }, icon(ICON_STEPS), "Show steps"));
    }
    this.actions.append(h("button", {
      type: "button", class: "chip",
      title: "Make the next message follow this turn (a new branch)",
      onclick: () => branchFrom(this.turn.turn_id),
    }, icon(ICON_BRANCH), "Branch from here"));
  }

  setNote(text) {
    this.note.textContent = text || "";
  }

  /** Start showing the event timeline (from seq 0: whatever was shown goes). */
  beginTimeline() {
    this.detailed = true;
    this.lastSeq = 0;
    this.lastKind = null;
    this.blocks.clear();
    this.calls.clear();
    this.current = null;
    const keepApprovals = [...this.approvals.values()];
    this.approvals.clear();
    this.body.replaceChildren();
    for (const card of keepApprovals) this.approvals.set(card.dataset.approvalId, card);
    this.renderFoot();
  }

  block(index) {
    let block = this.blocks.get(index);
    if (!block) {
      const textEl = h("div", { class: "text" });
      const bubble = h("div", { class: "bubble agent empty" }, textEl);
      const tools = h("div", { class: "tools" });
      const el = h("div", { class: "step", dataset: { step: index } }, bubble, tools);
      block = { el, bubble, textEl, tools, committed: false, streamed: "", source: "" };
      this.blocks.set(index, block);
      this.body.append(el);
    }
    this.current = block;
    return block;
  }

  apply(event) {
    const d = event.data || {};
    this.lastSeq = Math.max(this.lastSeq, event.seq || 0);
    this.lastKind = event.kind;
    if (this.status === "waiting" && ["token", "tool_result", "step", "steer"].includes(event.kind)) {
      this.setStatus("running"); // answered: the turn went on
    }
    switch (event.kind) {
      case "queued":
        if (d.resume) {
          this.divider("resumed: carrying on from the last committed step", "resume");
          this.resuming = true;
        }
        this.setStatus("queued");
        break;
      case "started":
        // A later attempt after a resume is the resume itself; otherwise another worker
        // took the turn over (its driver died).
        if (d.attempt > 1 && !this.resuming) {
          this.divider(`another worker took over (attempt ${d.attempt})`, "resume");
        }
        this.resuming = false;
        this.setStatus("running");
        break;
      case "token": {
        const block = this.block(d.step);
        if (block.committed) break;
        block.streamed += d.text ?? "";
        this.showText(block, block.streamed);
        break;
      }
      case "tool_call":
        this.toolCard(d.step, d.call_id, d.name, d.arguments);
        break;
      case "tool_result": {
        const card = this.toolCard(d.step, d.call_id, d.name, null);
        this.setResult(card, d);
        break;
      }
      case "refusal": {
        const card = this.calls.get(d.call_id);
        const notice = h("div", { class: "refusal", role: "note" },
          icon(ICON_REFUSED, "icon refusal-icon"),
          h("div", {},
            h("div", { class: "refusal-head" },
              "Refused ", h("code", {}, d.tool || "a tool call"),
              d.rule ? [" by ", h("code", { class: "rule" }, d.rule)] : ""),
            d.reason ? h("div", { class: "refusal-reason", text: d.reason }) : ""));
        if (card) {
          card.classList.add("refused");
          card.after(notice);
        } else {
          (this.current?.tools || this.body).append(notice);
        }
        break;
      }
      case "steer": {
        const pending = this.pendingSteers.findIndex((p) => p.text === d.text);
        if (pending >= 0) {
          const [p] = this.pendingSteers.splice(pending, 1);
          p.el.remove();
        }
        // Announced once the step whose request carried it committed, after that step's
        // tokens: shown above the step it reached.
        const bubble = this.steerBubble(d.text, "delivered");
        const reached = this.blocks.get(d.step);
        if (reached) reached.el.before(bubble);
        else this.body.append(bubble);
        break;
      }
      case "check":
        this.body.append(h("div", { class: `check ${d.passed ? "passed" : "failed"}` },
          h("div", { class: "check-head" },
            d.passed ? "✓ check passed" : "✗ check failed",
            d.exit_code !== null && d.exit_code !== undefined ? ` (exit ${d.exit_code})` : ""),
          d.output ? h("pre", { class: "mono", text: d.output }) : ""));
        break;
      case "step": {
        const block = this.block(d.index);
        block.committed = true;
        // The committed text is the truth; the streamed tokens were provisional.
        this.showText(block, d.text ?? "");
        for (const call of d.tool_calls || []) {
          if (!this.calls.has(call.id)) this.toolCard(d.index, call.id, call.name, call.arguments);
        }
        const usage = d.usage || {};
        const tokens = (usage.input_tokens ?? 0) + (usage.output_tokens ?? 0);
        const div = h("div", { class: "step-divider", role: "separator" },
          h("span", {}, `✓ step ${Number(d.index) + 1}`));
        div.title = `step ${Number(d.index) + 1} committed`
          + (tokens ? `: ${usage.input_tokens ?? 0} tokens in, ${usage.output_tokens ?? 0} out` : "");
        block.el.append(div);
        this.current = null;
        break;
      }
      case "step_restarted": {
        const old = this.blocks.get(d.index);
        if (old) {
          this.showText(old, "");
          old.el.classList.add("superseded");
          for (const [id, card] of this.calls) {
            if (old.tools.contains(card)) this.calls.delete(id);
          }
          this.blocks.delete(d.index);
        }
        if (d.reason !== "resumed") {
          this.divider(`step ${Number(d.index) + 1} is being redone${d.reason ? ` (${d.reason})` : ""}`, "restart");
        }
        break;
      }
      case "approval_requested":
        this.approval(d);
        this.setStatus("waiting"); // the turn holds no worker until every call has an answer
        break;
      case "end": {
        this.turn.reply = d.reply ?? null;
        const texts = [...this.blocks.values()].map((b) => b.source.trim());
        if (d.reply && !texts.includes(d.reply.trim())) this.body.append(replyBubble(d.reply));
        if (d.error) {
          this.body.append(h("div", { class: "turn-error", role: "note", text: d.error }));
        }
        for (const text of d.undelivered || []) {
          const i = this.pendingSteers.findIndex((p) => p.text === text);
          if (i >= 0) {
            const [p] = this.pendingSteers.splice(i, 1);
            p.el.replaceWith(this.steerBubble(text, "undelivered"));
          } else {
            this.body.append(this.steerBubble(text, "undelivered"));
          }
        }
        for (const block of this.blocks.values()) {
          // Text streamed in a step that never committed: display-only, never replayed.
          if (!block.committed && block.streamed && !block.el.classList.contains("partial")) {
            block.el.classList.add("partial");
            block.bubble.after(h("div", { class: "partial-tag" },
              "interrupted here: this text is shown, not kept for the model"));
          }
        }
        for (const card of this.approvals.values()) card.classList.add("closed");
        this.setStatus(d.outcome || "finished");
        break;
      }
      default:
        break; // a kind this page does not know yet: nothing to show
    }
    this.refreshLive();
  }

  /** Show ``text`` (Markdown) as a step's text: rendered at the next frame, once for
   *  however many tokens arrived before it (a long reply replayed is not parsed once per
   *  token). */
  showText(block, text) {
    block.source = text;
    block.bubble.classList.toggle("empty", !text);
    this.unrendered.add(block);
    if (this.unrendered.size === 1) requestAnimationFrame(() => this.renderTexts());
  }

  renderTexts() {
    for (const block of this.unrendered) renderMarkdown(block.textEl, block.source);
    this.unrendered.clear();
    this.refreshLive();
    contentChanged();
  }

  divider(text, kind) {
    this.body.append(h("div", { class: `note-divider ${kind}`, role: "note" }, h("span", {}, text)));
    this.current = null;
  }

  toolCard(step, callId, name, args) {
    let card = this.calls.get(callId);
    if (card) {
      if (args !== null && args !== undefined && !card.dataset.args) this.fillArgs(card, args);
      return card;
    }
    const block = this.block(step ?? this.current?.el?.dataset.step ?? 0);
    const stateEl = h("span", { class: "tool-state running" }, "running…");
    const preview = h("span", { class: "tool-preview" });
    card = h("details", { class: "tool", dataset: { callId } },
      h("summary", {},
        h("span", { class: "tool-icon", "aria-hidden": "true" }, "⚙"),
        h("span", { class: "tool-name" }, name || "tool"),
        preview, stateEl),
      h("div", { class: "tool-body" }));
    card.stateEl = stateEl;
    card.previewEl = preview;
    if (args !== null && args !== undefined) this.fillArgs(card, args);
    block.tools.append(card);
    this.calls.set(callId, card);
    return card;
  }

  fillArgs(card, args) {
    card.dataset.args = "1";
    card.previewEl.textContent = argumentsPreview(args);
    card.querySelector(".tool-body").prepend(
      h("div", { class: "tool-label" }, "arguments"),
      h("pre", { class: "mono", text: prettyArguments(args) }));
  }

  setResult(card, d) {
    const label = d.refusal ? "refused" : d.is_error ? "error" : "done";
    card.stateEl.className = `tool-state ${label}`;
    card.stateEl.textContent = label;
    if (d.refusal) card.classList.add("refused");
    if (d.is_error) card.classList.add("errored");
    card.querySelector(".tool-body").append(
      h("div", { class: "tool-label" }, "result"),
      h("pre", { class: "mono", text: d.content ?? "" }));
  }

  steerBubble(text, status) {
    const label = {
      delivered: "steer · delivered",
      pending: "steer · waits for the next step",
      undelivered: "steer · not delivered: the turn stopped first",
    }[status];
    const extra = status === "undelivered" ? h("button", {
      type: "button", class: "chip small",
      onclick: (e) => { e.currentTarget.remove(); startTurn(text); },
    }, "Send as a new message") : "";
    return h("div", { class: `row user-row steer-row ${status}` },
      h("div", { class: "bubble user steer" },
        h("div", { class: "steer-label" }, label),
        h("div", { class: "text", text }),
        extra));
  }

  addPendingSteer(text) {
    const el = this.steerBubble(text, "pending");
    this.body.append(el);
    this.pendingSteers.push({ text, el });
    this.refreshLive();
  }

  approval(a) {
    const id = a.approval_id;
    if (!id || this.approvals.has(id)) return;
    const status = h("span", { class: "approval-status" });
    const approve = h("button", { type: "button", class: "chip approve" }, "Approve");
    const deny = h("button", { type: "button", class: "chip deny" }, "Deny");
    const card = h("div", { class: "approval", dataset: { approvalId: id }, role: "group",
      "aria-label": `Approval for ${a.tool || "a tool call"}` },
      h("div", { class: "approval-head" },
        icon(ICON_ASK, "icon approval-icon"), " Approval needed: ",
        h("code", {}, a.tool || "tool")),
      a.arguments !== undefined
        ? h("pre", { class: "mono", text: typeof a.arguments === "string" ? prettyArguments(a.arguments) : JSON.stringify(a.arguments, null, 2) })
        : "",
      h("div", { class: "approval-actions" }, approve, deny, status));
    const decide = async (decision) => {
      approve.disabled = deny.disabled = true;
      try {
        await api("POST", `/v1/turns/${encodeURIComponent(this.turn.turn_id)}/approvals/${encodeURIComponent(id)}`, { decision });
        status.textContent = decision === "approve" ? "✓ approved" : "✗ denied";
        card.classList.add("closed", decision);
      } catch (err) {
        approve.disabled = deny.disabled = false;
        report(err, "The answer was not taken");
      }
      focusBox();
    };
    for (const card of this.calls.values()) {
      if (card.stateEl.classList.contains("running") && card.querySelector(".tool-name").textContent === a.tool) {
        card.stateEl.className = "tool-state asking";
        card.stateEl.textContent = "awaiting approval";
      }
    }
    approve.addEventListener("click", () => decide("approve"));
    deny.addEventListener("click", () => decide("deny"));
    this.approvals.set(id, card);
    this.body.append(card);
  }

  /** The streaming caret after the text that is arriving, or the typing dots while the
   *  agent works on something else (a tool, the next model call). */
  refreshLive() {
    const running = this.live && this.running;
    this.el.classList.toggle("live", running);
    if (!running || this.status === "waiting") {
      this.caret.remove();
      this.typing.remove();
      return;
    }
    const streaming = this.current && !this.current.committed && this.current.streamed
      && this.current.tools.childElementCount === 0;
    if (streaming) {
      this.typing.remove();
      // At the end of the text's last line: inside its deepest last element (a
      // paragraph, a list item, a code block), not on a line of its own after it.
      this.caret.remove();
      let end = this.current.textEl;
      while (end.lastElementChild && !VOID_TAGS.has(end.lastElementChild.tagName)) end = end.lastElementChild;
      end.append(this.caret);
    } else {
      this.caret.remove();
      this.body.append(this.typing);
    }
  }
}

/** A reply as a bubble of rendered Markdown. */
function replyBubble(text) {
  const el = h("div", { class: "text" });
  renderMarkdown(el, text);
  return h("div", { class: "bubble agent" }, el);
}

// ---------------------------------------------------------------- page state

const state = {
  token: null,
  locked: false,
  sessions: [],
  sessionsDone: false,
  sessionId: null,
  session: null,
  history: [],
  tree: [],
  views: new Map(), // turn id → TurnView
  followers: new Map(), // turn id → Follower
  generation: 0, // bumped on every session switch: late answers for another are dropped
};

/** A session's name: its title (the first prompt's, unless one was set), else its
 *  workspace's name if it chose one. */
function sessionTitle(s) {
  if (s.title) return s.title;
  if (s.workspace && s.workspace !== s.id) return s.workspace;
  return "New session";
}

/** The turn the next message follows: the stored head, or the turn that started under
 *  it and has not ended (a turn takes its place under the head when it starts, and the
 *  next one hangs under it), so the mark moves when a turn starts, not when it ends. */
function shownHead() {
  let head = state.session?.head_turn_id ?? null;
  const seen = new Set();
  for (;;) {
    const next = state.tree.find((t) => (t.parent_id ?? null) === head && !seen.has(t.turn_id)
      && t.status !== "queued" && !TERMINAL.has(t.status));
    if (!next) return head;
    seen.add(next.turn_id);
    head = next.turn_id;
  }
}

// ---------------------------------------------------------------- sessions list

async function loadSessions({ more = false } = {}) {
  const before = more && state.sessions.length ? `&before=${encodeURIComponent(state.sessions.at(-1).id)}` : "";
  try {
    const { data } = await api("GET", `/v1/sessions?limit=${SESSIONS_PAGE}${before}`);
    const page = data.sessions || [];
    state.sessions = more ? [...state.sessions, ...page] : page;
    state.sessionsDone = page.length < SESSIONS_PAGE;
    renderSessions();
  } catch (err) {
    report(err, "Could not list the sessions");
  }
}

function renderSessions() {
  const list = $("session-list");
  list.replaceChildren();
  for (const s of state.sessions) {
    const current = s.id === state.sessionId;
    list.append(h("li", {},
      h("button", {
        type: "button", class: `session-item${current ? " current" : ""}`,
        "aria-current": current ? "true" : undefined,
        title: `${s.id}\ncreated ${fullTime(s.created_at)}`,
        onclick: () => { closeSidebar(); selectSession(s.id); },
      },
      h("span", { class: "session-name" }, sessionTitle(s)),
      h("span", { class: "session-meta" }, when(s.created_at), " · ", shortId(s.id)))));
  }
  $("sessions-empty").hidden = state.sessions.length > 0;
  $("sessions-more").hidden = state.sessionsDone;
}

async function newSession() {
  try {
    const { data } = await api("POST", "/v1/sessions", {});
    state.sessions = [data, ...state.sessions.filter((s) => s.id !== data.id)];
    await selectSession(data.id);
    renderSessions();
    return data;
  } catch (err) {
    report(err, "Could not create a session");
    return null;
  } finally {
    focusBox();
  }
}

// ---------------------------------------------------------------- one session

function stopFollowers() {
  for (const follower of state.followers.values()) follower.stop();
  state.followers.clear();
}

async function selectSession(id) {
  if (!id) return;
  if (id !== state.sessionId) {
    stopFollowers();
    state.generation += 1;
    state.sessionId = id;
    state.session = null;
    state.history = [];
    state.tree = [];
    state.views.clear();
    $("turns").replaceChildren();
    stick = true;
  }
  if (location.hash !== `#s=${id}`) history.replaceState(history.state, "", `#s=${encodeURIComponent(id)}`);
  renderSessions();
  renderHeader();
  await refreshSession({ scroll: true });
  focusBox();
}

async function refreshSession({ scroll = false } = {}) {
  const id = state.sessionId;
  const generation = state.generation;
  if (!id) return;
  const base = `/v1/sessions/${encodeURIComponent(id)}`;
  let session;
  let historyTurns;
  let treeTurns;
  try {
    [session, historyTurns, treeTurns] = await Promise.all([
      api("GET", base).then((r) => r.data),
      api("GET", `${base}/history`).then((r) => r.data.turns || []),
      api("GET", `${base}/tree`).then((r) => r.data.turns || []),
    ]);
  } catch (err) {
    if (generation !== state.generation) return;
    if (err instanceof ApiError && err.status === 404) {
      banner("That session is not there (or not this token's). Pick another one.");
      state.sessionId = null;
      history.replaceState(history.state, "", location.pathname + location.search);
      renderHeader();
      renderConversation();
      return;
    }
    report(err, "Could not load the session");
    return;
  }
  if (generation !== state.generation) return;
  state.session = session;
  state.history = historyTurns;
  state.tree = treeTurns;
  const known = state.sessions.find((s) => s.id === id);
  if (known) Object.assign(known, session);
  else state.sessions.unshift(session);
  renderSessions();
  renderHeader();
  renderTree();
  renderConversation();
  followActive();
  if (scroll) {
    showRecentSteps();
    scrollToBottom(true);
  }
}

/** On opening a session, the newest ended turns show their steps too (tool calls,
 *  steers), replayed from their stored events; older ones show their reply until asked. */
function showRecentSteps(count = 3) {
  const ended = state.history.filter((t) => TERMINAL.has(t.status)).slice(-count);
  for (const t of ended) {
    const view = state.views.get(t.turn_id);
    if (view && !view.detailed && !state.followers.has(t.turn_id)) follow(view, { fromStart: true });
  }
}

/** A turn started from elsewhere (another tab, a script) shows up within a few seconds:
 *  while the tab is visible and nothing is being followed, the tree is asked now and then. */
async function watchTree() {
  const id = state.sessionId;
  if (!id || state.locked || document.visibilityState !== "visible" || state.followers.size) return;
  try {
    const { data } = await api("GET", `/v1/sessions/${encodeURIComponent(id)}/tree`);
    const sign = (turns) => turns.map((t) => `${t.turn_id}:${t.status}`).join();
    if (id === state.sessionId && sign(data.turns || []) !== sign(state.tree)) refreshSoon();
  } catch {
    // the next look will tell; a banner every few seconds would be noise
  }
}

let refreshTimer = null;
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => refreshSession(), 150);
}

function renderHeader() {
  const s = state.session || state.sessions.find((x) => x.id === state.sessionId);
  $("session-title").textContent = s ? sessionTitle(s) : "parley";
  const sub = $("session-sub");
  sub.replaceChildren();
  if (s) {
    sub.append(
      h("span", { title: s.id }, `session ${shortId(s.id)}`),
      s.workspace && s.workspace !== s.id ? h("span", {}, ` · workspace ${s.workspace}`) : "",
      state.tree.length ? h("span", {}, ` · ${state.tree.length} turn${state.tree.length === 1 ? "" : "s"}`) : "",
    );
  } else {
    sub.textContent = "durable, steerable agent conversations";
  }
  document.title = s ? `${sessionTitle(s)} · parley` : "parley";
}

// ---------------------------------------------------------------- the tree

function renderTree() {
  const section = $("tree-section");
  const tree = $("tree");
  tree.replaceChildren();
  section.hidden = !state.sessionId || state.tree.length === 0;
  const head = shownHead();
  const onPath = new Set(state.history.map((t) => t.turn_id));
  const ids = new Set(state.tree.map((t) => t.turn_id));
  const children = new Map();
  const waiting = []; // queued turns: they take their place in the tree when they start
  for (const t of state.tree) {
    if (!t.parent_id && t.status === "queued" && state.tree.length > 1) {
      waiting.push(t);
      continue;
    }
    const parent = t.parent_id && ids.has(t.parent_id) ? t.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(t);
  }
  for (const list of children.values()) {
    list.sort((a, b) => String(a.created_at).localeCompare(String(b.created_at)));
  }
  const row = (t) => {
    const isHead = t.turn_id === head;
    return h("li", {
      class: `node-row${onPath.has(t.turn_id) ? " on-path" : ""}${isHead ? " head" : ""}`,
      dataset: { turnId: t.turn_id },
      "aria-current": isHead ? "true" : undefined,
      title: `${t.prompt ?? ""}${t.reply ? `\n→ ${oneLine(t.reply, 200)}` : ""}\n(${STATUS_LABEL[t.status] || t.status})`,
    },
    h("span", { class: `dot status-${t.status}`, "aria-hidden": "true" }),
    h("button", {
      type: "button", class: "node-label",
      onclick: () => showTurn(t.turn_id),
    }, oneLine(t.prompt, 60) || "(empty prompt)"),
    isHead ? h("span", { class: "head-mark", title: "the head: the next message follows this turn" }, "head") : "",
    h("button", {
      type: "button", class: "icon-button branch",
      "aria-label": "Branch from here",
      title: "Branch from here: the next message follows this turn",
      onclick: () => branchFrom(t.turn_id),
    }, icon(ICON_BRANCH)));
  };
  // A chain of single children stays at one level; where a turn has several children,
  // each of them starts an indented branch.
  const chain = (first) => {
    const list = h("ul", { class: "chain" });
    let t = first;
    while (t) {
      list.append(row(t));
      const kids = children.get(t.turn_id) || [];
      if (kids.length === 1) {
        t = kids[0];
        continue;
      }
      if (kids.length > 1) {
        list.append(h("li", { class: "fork" },
          kids.map((k) => h("div", { class: `branch-line${onPath.has(k.turn_id) ? " on-path" : ""}` }, chain(k)))));
      }
      t = null;
    }
    return list;
  };
  for (const rootTurn of children.get(null) || []) tree.append(chain(rootTurn));
  if (waiting.length) {
    const list = h("ul", { class: "chain waiting" });
    for (const t of waiting) list.append(row(t));
    tree.append(list);
  }
}

function showTurn(turnId) {
  const view = state.views.get(turnId);
  if (view && view.el.isConnected) {
    view.el.scrollIntoView({ behavior: "smooth", block: "center" });
    view.el.classList.remove("flash");
    void view.el.offsetWidth;
    view.el.classList.add("flash");
    closeSidebar();
  } else {
    banner("That turn is on another branch. “Branch from here” makes it part of the conversation.",
      { kind: "info", timeout: 5000 });
  }
}

async function branchFrom(turnId) {
  const id = state.sessionId;
  try {
    await api("POST", `/v1/sessions/${encodeURIComponent(id)}/branch`, { turn_id: turnId });
    const t = state.tree.find((x) => x.turn_id === turnId);
    banner(`Branched: the next message follows “${oneLine(t?.prompt, 50)}”.`, { kind: "info", timeout: 4000 });
    await refreshSession();
    scrollToBottom(true);
  } catch (err) {
    report(err, "Could not branch");
  }
  focusBox();
}

// ---------------------------------------------------------------- the conversation

function renderConversation() {
  const list = $("turns");
  const shown = [...state.history];
  const onPath = new Set(shown.map((t) => t.turn_id));
  // A turn that has not ended takes its place in the history when it commits: until then
  // it shows after the head (or, if it hangs under another turn, as on another branch).
  const head = state.session?.head_turn_id ?? null;
  const pending = state.tree.filter((t) => !onPath.has(t.turn_id) && !TERMINAL.has(t.status));
  const elsewhere = new Set(pending
    .filter((t) => t.parent_id && t.parent_id !== head && !pending.some((p) => p.turn_id === t.parent_id))
    .map((t) => t.turn_id));
  const wanted = [];
  for (const t of [...shown, ...pending]) {
    let view = state.views.get(t.turn_id);
    if (!view) {
      view = new TurnView(t);
      state.views.set(t.turn_id, view);
    } else {
      view.update(t);
    }
    view.el.classList.toggle("elsewhere", elsewhere.has(t.turn_id));
    view.el.classList.toggle("is-head", t.turn_id === shownHead());
    wanted.push(view.el);
  }
  // Views of turns not shown now stay cached (the GETs behind one render may straddle a
  // commit, and a turn seen live keeps its timeline when it comes back).
  const current = [...list.children];
  if (current.length !== wanted.length || current.some((el, i) => el !== wanted[i])) {
    list.replaceChildren(...wanted);
  }
  $("empty-state").hidden = wanted.length > 0;
  updateComposer();
}

/** Follow every turn of the session that has not ended (normally at most one). */
function followActive() {
  for (const t of state.tree) {
    if (!TERMINAL.has(t.status) && !state.followers.has(t.turn_id)) {
      const view = state.views.get(t.turn_id);
      if (view) follow(view, { fromStart: !view.detailed || view.lastSeq === 0 });
    }
  }
}

function follow(view, { fromStart = false } = {}) {
  const id = view.turn.turn_id;
  state.followers.get(id)?.stop();
  if (fromStart) view.beginTimeline();
  // Replaying an ended turn from its start: the statuses it went through are history.
  // Followed on from its end, whatever comes (a resume) is news.
  view.replaying = fromStart && !view.running;
  view.live = true;
  view.refreshLive();
  const generation = state.generation;
  const follower = new Follower(id, view.lastSeq, {
    lastKind: view.lastKind,
    onEvent: (event) => {
      if (generation !== state.generation) return;
      view.apply(event);
      contentChanged();
    },
    onState: (s, pause) => {
      if (generation !== state.generation) return;
      if (s === "reconnecting") view.setNote("reconnecting…");
      else if (s === "live" || s === "ended") view.setNote("");
      if (s === "ended" || s === "gone") {
        const replayed = view.replaying;
        view.live = false;
        view.replaying = false;
        view.refreshLive();
        if (state.followers.get(id) === follower) state.followers.delete(id);
        updateComposer();
        // A turn that ended just now moved the head (one still ended, nothing did).
        if (!replayed && follower.received) refreshSoon();
      }
      renderLiveState();
    },
    onGone: () => banner("That turn is no longer there."),
  });
  state.followers.set(id, follower);
  renderLiveState();
  updateComposer();
  if (view.status === "waiting") loadApprovals(view);
  return follower;
}

async function loadApprovals(view) {
  try {
    const { data } = await api("GET", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}`);
    for (const a of data.pending_approvals || []) view.approval(a);
    view.refreshLive();
    contentChanged();
  } catch (err) {
    report(err, "Could not read the turn's approvals");
  }
}

async function showSteps(view) {
  if (state.followers.has(view.turn.turn_id)) return;
  follow(view, { fromStart: true });
}

/** Called by a view whose status changed. */
function onTurnStatus(view) {
  if (view.status === "waiting" && view.approvals.size === 0) loadApprovals(view);
  const inTree = state.tree.find((t) => t.turn_id === view.turn.turn_id);
  if (inTree && inTree.status !== view.status) {
    const started = inTree.status === "queued";
    inTree.status = view.status;
    renderTree();
    // Started: it has its place in the tree now, under the head (and the head mark
    // moves to it); the tree as read at submission did not say where.
    if (started && !TERMINAL.has(view.status)) refreshSoon();
  }
  updateComposer();
  if (TERMINAL.has(view.status)) refreshSoon();
}

/** The turn the message box steers: the newest followed turn that has not ended. */
function activeView() {
  let found = null;
  for (const [id, follower] of state.followers) {
    const view = state.views.get(id);
    if (view && view.running && !follower.done) found = view;
  }
  return found;
}

function renderLiveState() {
  const el = $("live-state");
  el.replaceChildren();
  const view = activeView();
  if (!view) return;
  const follower = state.followers.get(view.turn.turn_id);
  const reconnecting = follower?.state === "reconnecting" || follower?.state === "connecting";
  el.append(h("span", { class: `live-dot${reconnecting ? " off" : ""}` }),
    reconnecting ? "reconnecting…" : "live");
}

async function startTurn(text) {
  if (!state.sessionId) {
    const made = await newSession();
    if (!made) return false;
  }
  const id = state.sessionId;
  try {
    const { data: turn } = await api("POST", `/v1/sessions/${encodeURIComponent(id)}/turns`, { prompt: text });
    if (id !== state.sessionId) return true;
    if (!state.tree.some((t) => t.turn_id === turn.turn_id)) state.tree.push(turn);
    stick = true;
    renderConversation();
    renderTree();
    renderSessions();
    renderHeader();
    const view = state.views.get(turn.turn_id);
    if (view && !state.followers.has(turn.turn_id)) follow(view, { fromStart: true });
    scrollToBottom(true);
    refreshSoon();
    return true;
  } catch (err) {
    report(err, "The message was not sent");
    return false;
  }
}

async function resumeTurn(view) {
  try {
    const { data: turn } = await api("POST", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}/resume`);
    stick = true;
    const same = turn.turn_id === view.turn.turn_id;
    if (same) {
      view.turn.status = turn.status || "queued";
      view.renderFoot();
      // Carry on from what is on screen: the resumed events come after it.
      follow(view, { fromStart: !view.detailed });
    }
    await refreshSession();
    // (The same turn is followed already: it may even have ended by now, and following
    // it again would replay it.)
    const again = state.views.get(turn.turn_id);
    if (!same && again && !state.followers.has(turn.turn_id)) follow(again, { fromStart: true });
    scrollToBottom(true);
  } catch (err) {
    report(err, "Could not resume");
  }
  focusBox();
}

async function interrupt() {
  const view = activeView();
  if (!view) return;
  try {
    await api("POST", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}/interrupt`);
    if (view.running) view.setNote("stopping at the next step…");
  } catch (err) {
    if (!(err instanceof ApiError && err.type === "TurnEnded")) report(err, "Could not interrupt");
  }
  focusBox();
}

// ---------------------------------------------------------------- the message box

const box = () => $("message");

function focusBox() {
  if (window.matchMedia("(pointer: coarse)").matches) return; // no keyboard popping up
  box().focus({ preventScroll: true });
}

function updateComposer() {
  const view = activeView();
  const steering = Boolean(view);
  $("composer-box").classList.toggle("steering", steering);
  $("mode-pill").hidden = !steering;
  $("interrupt").hidden = !steering;
  box().placeholder = steering
    ? "Steer the running turn — the agent reads this at its next step…"
    : state.history.length ? "Reply…" : "Message parley…";
  $("send").title = steering ? "Steer the running turn (Enter)" : "Send (Enter)";
  const hint = $("composer-hint");
  hint.replaceChildren();
  if (steering) {
    append(hint, [h("kbd", {}, "Enter"), " steers the running turn · ",
      h("strong", {}, "Interrupt"), " stops it at the next step"]);
  } else {
    append(hint, [h("kbd", {}, "Enter"), " to send · ", h("kbd", {}, "Shift"), "+",
      h("kbd", {}, "Enter"), " for a new line"]);
  }
  renderLiveState();
}

let sending = false;
async function send() {
  const input = box();
  const text = input.value;
  if (!text.trim() || sending || state.locked) return;
  sending = true;
  $("send").disabled = true;
  input.value = "";
  autosize();
  try {
    const view = activeView();
    let ok = true;
    if (view) {
      try {
        await api("POST", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}/say`, { text });
        view.addPendingSteer(text);
        stick = true;
        contentChanged();
      } catch (err) {
        if (err instanceof ApiError && err.status === 409 && err.type === "TurnEnded") {
          ok = await startTurn(text); // it ended just now: the text starts the next turn
        } else {
          report(err, "The steer was not sent");
          ok = false;
        }
      }
    } else {
      ok = await startTurn(text);
    }
    if (!ok && !input.value) {
      input.value = text; // nothing typed is lost
      autosize();
    }
  } finally {
    sending = false;
    $("send").disabled = false;
    focusBox();
  }
}

function autosize() {
  const input = box();
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
}

// ---------------------------------------------------------------- scrolling

// The view follows new output while the reader is at the bottom; once they scroll up it
// stays where they are (and offers a jump back) until they return to the bottom.
let stick = true;
let scrollQueued = false;
let lastTop = 0;
let lastHeight = 0;

function nearBottom(el, slack = 8) {
  return el.scrollHeight - el.scrollTop - el.clientHeight <= slack;
}

function scrollToBottom(force = false) {
  if (force) stick = true;
  const conv = $("conversation");
  conv.scrollTop = conv.scrollHeight;
  lastTop = conv.scrollTop;
  lastHeight = conv.scrollHeight;
  $("jump").hidden = true;
}

function onScroll(conv) {
  const top = conv.scrollTop;
  const height = conv.scrollHeight;
  // A move up is the reader's doing only if the content kept its height: content that
  // shrinks pulls the position up too (and content growing below never scrolls).
  if (top < lastTop - 1 && height === lastHeight) stick = false;
  if (nearBottom(conv)) stick = true;
  lastTop = top;
  lastHeight = height;
  if (stick) $("jump").hidden = true;
}

function contentChanged() {
  if (scrollQueued) return;
  scrollQueued = true;
  requestAnimationFrame(() => {
    scrollQueued = false;
    const conv = $("conversation");
    if (conv.scrollHeight <= conv.clientHeight + 8) stick = true;
    if (stick) scrollToBottom();
    else $("jump").hidden = false;
  });
}

// ---------------------------------------------------------------- sidebar (narrow screens)

function closeSidebar() {
  document.body.classList.remove("sidebar-open");
  $("sidebar-toggle").setAttribute("aria-expanded", "false");
}

function toggleSidebar() {
  const open = document.body.classList.toggle("sidebar-open");
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}

// ---------------------------------------------------------------- start

function sessionFromHash() {
  const match = /(?:^#|&)s=([^&]+)/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

async function main() {
  state.token = takeToken();
  const input = box();
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      send();
    }
  });
  input.addEventListener("input", autosize);
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("interrupt").addEventListener("click", interrupt);
  $("new-session").addEventListener("click", () => { closeSidebar(); newSession(); });
  $("sessions-more").addEventListener("click", () => loadSessions({ more: true }));
  $("sidebar-toggle").addEventListener("click", toggleSidebar);
  $("main").addEventListener("click", (e) => {
    if (document.body.classList.contains("sidebar-open") && !$("sidebar-toggle").contains(e.target)) {
      closeSidebar();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && document.body.classList.contains("sidebar-open")) closeSidebar();
  });
  $("jump").addEventListener("click", () => scrollToBottom(true));
  for (const suggestion of document.querySelectorAll(".suggestion")) {
    suggestion.addEventListener("click", () => {
      box().value = suggestion.dataset.prompt;
      send();
    });
  }
  const conv = $("conversation");
  conv.addEventListener("scroll", () => onScroll(conv), { passive: true });
  // Whatever makes the conversation grow (an event, a refresh, a card opened at the end)
  // keeps the end in view while the reader is there.
  new ResizeObserver(() => contentChanged()).observe($("turns"));
  conv.addEventListener("wheel", (e) => { if (e.deltaY < 0) stick = false; }, { passive: true });
  window.addEventListener("hashchange", () => {
    const id = sessionFromHash();
    if (id && id !== state.sessionId) selectSession(id);
  });
  window.addEventListener("online", () => {
    for (const follower of state.followers.values()) follower.poke();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.sessionId && !state.locked) refreshSoon();
  });
  updateComposer();
  setInterval(watchTree, 8000);

  if (!state.token) {
    lock("");
    return;
  }
  await loadSessions();
  if (state.locked) return;
  const wanted = sessionFromHash() || state.sessions[0]?.id;
  if (wanted) await selectSession(wanted);
  else renderConversation();
  focusBox();
}

main();
