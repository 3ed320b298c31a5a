// Tool calls on a turn's timeline: a card per call (its arguments, then its result) and
// the notice of a call a rule refused.

import { h, icon } from "../dom.js";
import { oneLine } from "../format.js";
import { ICON_REFUSED } from "../icons.js";

export function prettyArguments(text) {
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

/** The card of a call (made under its step when first met), its arguments filled in
 *  once they are known. */
export function toolCard(view, step, callId, name, args) {
  let card = view.calls.get(callId);
  if (card) {
    if (args !== null && args !== undefined && !card.dataset.args) fillArgs(card, args);
    return card;
  }
  const block = view.block(step ?? view.current?.el?.dataset.step ?? 0);
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
  if (args !== null && args !== undefined) fillArgs(card, args);
  block.tools.append(card);
  view.calls.set(callId, card);
  return card;
}

function fillArgs(card, args) {
  card.dataset.args = "1";
  card.argsText = args;
  card.onArgs?.(args); // an agent call's card shows its task
  card.previewEl.textContent = argumentsPreview(args);
  card.querySelector(".tool-body").prepend(
    h("div", { class: "tool-label" }, "arguments"),
    h("pre", { class: "mono", text: prettyArguments(args) }));
}

function setResult(card, d) {
  const label = d.refusal ? "refused" : d.is_error ? "error" : "done";
  card.stateEl.className = `tool-state ${label}`;
  card.stateEl.textContent = label;
  if (d.refusal) card.classList.add("refused");
  if (d.is_error) card.classList.add("errored");
  card.querySelector(".tool-body").append(
    h("div", { class: "tool-label" }, "result"),
    h("pre", { class: "mono", text: d.content ?? "" }));
}

export function onToolCall(view, d) {
  toolCard(view, d.step, d.call_id, d.name, d.arguments);
}

export function onToolResult(view, d) {
  setResult(toolCard(view, d.step, d.call_id, d.name, null), d);
}

export function onRefusal(view, d) {
  const card = view.calls.get(d.call_id);
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
    (view.current?.tools || view.body).append(notice);
  }
}
