// A turn's statuses as the page tells them apart: which have ended, which can be
// resumed, and the words its badge shows for each.

import { fullTime } from "./format.js";

export const TERMINAL = new Set([
  "finished", "succeeded", "check_failed", "budget_exceeded", "cancelled", "failed",
]);
export const RESUMABLE = new Set(["cancelled", "failed"]);
export const STATUS_LABEL = {
  queued: "queued",
  running: "running",
  waiting: "waiting for approval",
  throttled: "waiting for capacity",
  finished: "finished",
  succeeded: "succeeded",
  check_failed: "check failed",
  budget_exceeded: "budget exceeded",
  cancelled: "cancelled",
  failed: "failed",
};

// A delayed turn (docs/time.md) waits for its time holding nothing, a turn waiting for
// an event (docs/time.md#waiting-for-an-event) for its signal, and a turn whose step waits
// for its sub-agents' child turns (docs/sub-agents.md) for them: its badge says what for
// and until when, not merely "queued" or "waiting" ("" for any other turn).
export function delayedLabel(t) {
  if (t.status === "waiting" && t.waiting_for === "agents") return "waiting for agents";
  if (t.status === "waiting" && t.waiting_for === "event") {
    if (!t.waiting_event) return t.not_before ? `waiting until ${fullTime(t.not_before)}` : "";
    const until = t.not_before ? ` (until ${fullTime(t.not_before)})` : "";
    return `waiting for event ${t.waiting_event}${until}`;
  }
  if (t.status !== "queued" || t.waiting_for !== "time" || !t.not_before) return "";
  return `waiting until ${fullTime(t.not_before)}`;
}
