// One turn's tree of events (its own and every sub-agent's, docs/sub-agents.md), read
// with fetch and reconnecting with backoff from the cursor of the last event it saw until
// the tree's end (followed-turns.js keeps one per turn it follows).

import { SSEParser } from "./sse.js";
import { state } from "./state.js";
import { lock } from "./token.js";

// The gateway sends a keep-alive comment at least every 15 s by default: a stream silent
// for much longer than that is dead even if the socket has not said so.
const STALL_MS = 40_000;

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** Follows one turn's tree stream (`?children=1`) with fetch (EventSource cannot send a
 *  bearer token): every event of the turn and of its children once, each turn's in
 *  order, from `cursor` on (null: the start).  Each event carries its `path` (empty for
 *  the turn's own) and comes with the cursor that resumes after it: when the connection
 *  drops before the end it reconnects with backoff, sending the last cursor as
 *  `Last-Event-ID`.  `lastKind` is the kind of the turn's own last event before
 *  `cursor`: from an `end`, a stream that closes with nothing new is a turn still ended
 *  (not resumed since), not a connection lost. */
export class TurnStream {
  constructor(turnId, cursor, { lastKind = null, onEvent, onState, onGone }) {
    this.turnId = turnId;
    this.cursor = cursor || null;
    this.seen = new Map(); // turn id → the last seq given (a guard: the cursor says it)
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
      // One connection: aborted when the stream is stopped or stalls.
      const attempt = { abort: new AbortController(), stall: null, progressed: false };
      const abortAttempt = () => attempt.abort.abort();
      this.stopper.signal.addEventListener("abort", abortAttempt, { once: true });
      try {
        this.setState(failures ? "reconnecting" : "connecting");
        if (await this.connect(attempt)) return;
        throw new Error("the stream closed before the turn's end");
      } catch (err) {
        if (this.stopped) return;
        failures = attempt.progressed ? 1 : failures + 1;
        await this.backOff(failures);
      } finally {
        clearTimeout(attempt.stall);
        this.stopper.signal.removeEventListener("abort", abortAttempt);
      }
    }
  }

  /** One connection read to its close: true when there is nothing more to follow (the
   *  turn ended, is gone, or the token was refused). */
  async connect(attempt) {
    const feed = () => {
      clearTimeout(attempt.stall);
      attempt.stall = setTimeout(() => attempt.abort.abort(), STALL_MS);
    };
    feed();
    const url = `/v1/turns/${encodeURIComponent(this.turnId)}/events?children=1`;
    const headers = { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" };
    if (this.cursor) headers["Last-Event-ID"] = this.cursor;
    const res = await fetch(url, {
      headers,
      cache: "no-store",
      signal: attempt.abort.signal,
    });
    if (res.status === 401) {
      lock("The gateway did not accept this tab's token.");
      return true;
    }
    if (res.status === 404) {
      this.done = true;
      this.setState("gone");
      this.onGone?.();
      return true;
    }
    if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
    this.setState("live");
    await this.read(res.body, attempt, feed);
    if (this.lastKind !== "end") return false;
    this.done = true;
    this.setState("ended");
    return true;
  }

  async read(body, attempt, feed) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SSEParser((frame) => {
      let event;
      try { event = JSON.parse(frame.data); } catch { return; }
      const seq = Number(event.seq);
      const turn = String(event.turn_id ?? this.turnId);
      if (!Number.isFinite(seq) || seq <= (this.seen.get(turn) ?? -1)) return; // seen already
      this.seen.set(turn, seq);
      if (frame.id) this.cursor = frame.id;
      event.path = Array.isArray(event.path) ? event.path : [];
      if (event.path.length === 0) this.lastKind = event.kind || frame.type;
      this.received += 1;
      attempt.progressed = true;
      this.onEvent(event, this.cursor);
    });
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      feed();
      parser.push(value);
    }
  }

  async backOff(failures) {
    const pause = Math.min(8000, 400 * 2 ** (failures - 1)) * (0.75 + Math.random() * 0.5);
    this.setState("reconnecting", pause);
    this.wake = new AbortController();
    await sleep(pause, AbortSignal.any
      ? AbortSignal.any([this.stopper.signal, this.wake.signal])
      : this.stopper.signal);
  }
}
