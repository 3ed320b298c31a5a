// A turn's steps on its timeline: the queue and start, each step's streamed tokens and
// committed text, a step redone, and the check run after the last one.

import { h } from "../dom.js";
import { toolCard } from "./tools.js";

export function onQueued(view, d) {
  if (d.resume) {
    view.divider("resumed: carrying on from the last committed step", "resume");
    view.resuming = true;
  }
  view.setStatus("queued");
}

export function onStarted(view, d) {
  // A later attempt after a resume is the resume itself, and after a wait for capacity
  // the same turn going on; otherwise another worker took the turn over (its driver
  // died), unless it waited for its agents' child turns: then it goes on with their
  // results.  (Not told by the status: a replay of an ended turn sets none.)
  if (d.attempt > 1 && !view.resuming && !view.throttled && !view.heldForAgents) {
    view.divider(`another worker took over (attempt ${d.attempt})`, "resume");
  }
  view.resuming = false;
  view.throttled = false;
  view.heldForAgents = false;
  view.turn.waiting_for = null;
  view.setNote("");
  view.setStatus("running");
}

// The turn waits for its model's provider capacity, holding no worker: it goes on by
// itself when the capacity is due, so it is shown waiting, not hung.
export function onThrottled(view, d) {
  const seconds = Math.max(1, Math.round(d.seconds || 0));
  view.throttled = true; // its next attempt is this turn going on
  view.setStatus("throttled");
  view.setNote(`waiting for ${d.model || "the model"}'s capacity, about ${seconds} s`);
}

// A call waits for an event or a time (docs/time.md#waiting-for-an-event), holding no
// worker: the turn goes on by itself once signalled or once the time passes, so it is
// shown waiting for that event, and until when, not hung.
export function onWaiting(view, d) {
  view.throttled = true; // its next attempt is this turn going on
  view.turn.waiting_for = "event";
  view.turn.waiting_event = d.event ?? null;
  view.turn.not_before = d.until ?? null;
  if (view.status === "waiting") view.renderFoot();
  else view.setStatus("waiting");
}

export function onToken(view, d) {
  const block = view.block(d.step);
  if (block.committed) return;
  block.streamed += d.text ?? "";
  view.showText(block, block.streamed);
}

export function onStep(view, d) {
  const block = view.block(d.index);
  block.committed = true;
  // The committed text is the truth; the streamed tokens were provisional.
  view.showText(block, d.text ?? "");
  // A card made before its arguments were known (an agent call's) gets them now.
  for (const call of d.tool_calls || []) toolCard(view, d.index, call.id, call.name, call.arguments);
  const usage = d.usage || {};
  const tokens = (usage.input_tokens ?? 0) + (usage.output_tokens ?? 0);
  const div = h("div", { class: "step-divider", role: "separator" },
    h("span", {}, `✓ step ${Number(d.index) + 1}`));
  div.title = `step ${Number(d.index) + 1} committed`
    + (tokens ? `: ${usage.input_tokens ?? 0} tokens in, ${usage.output_tokens ?? 0} out` : "");
  block.el.append(div);
  view.current = null;
}

export function onStepRestarted(view, d) {
  const old = view.blocks.get(d.index);
  if (old) {
    view.showText(old, "");
    old.el.classList.add("superseded");
    for (const [id, card] of view.calls) {
      if (old.tools.contains(card)) view.calls.delete(id);
    }
    view.blocks.delete(d.index);
  }
  if (d.reason !== "resumed") {
    view.divider(`step ${Number(d.index) + 1} is being redone${d.reason ? ` (${d.reason})` : ""}`, "restart");
  }
}

export function onCheck(view, d) {
  view.body.append(h("div", { class: `check ${d.passed ? "passed" : "failed"}` },
    h("div", { class: "check-head" },
      d.passed ? "✓ check passed" : "✗ check failed",
      d.exit_code !== null && d.exit_code !== undefined ? ` (exit ${d.exit_code})` : ""),
    d.output ? h("pre", { class: "mono", text: d.output }) : ""));
}
