// A turn's foot: its status badge, when it started, and its controls (resume, show its
// steps, branch from it), each asking the view's actions.

import { h, icon } from "../dom.js";
import { fullTime, when } from "../format.js";
import { ICON_BRANCH, ICON_RESUME, ICON_STEPS } from "../icons.js";
import { delayedLabel, RESUMABLE, STATUS_LABEL } from "../status.js";

export function renderFoot(view) {
  const t = view.turn;
  view.badge.className = `badge status-${t.status}`;
  view.badge.textContent = delayedLabel(t) || STATUS_LABEL[t.status] || t.status || "";
  view.when.textContent = when(t.created_at);
  view.when.title = fullTime(t.created_at);
  if (t.created_at) view.when.dateTime = t.created_at;
  view.controls.replaceChildren();
  if (RESUMABLE.has(t.status)) {
    view.controls.append(h("button", {
      type: "button", class: "chip resume",
      title: "Carry this turn on from its last committed step",
      onclick: () => view.actions.resumeTurn(view),
    }, icon(ICON_RESUME), "Resume"));
  }
  if (!view.detailed && !view.running) {
    view.controls.append(h("button", {
      type: "button", class: "chip",
      title: "Show this turn's steps, tool calls and steers",
      onclick: () => view.actions.showSteps(view),
    }, icon(ICON_STEPS), "Show steps"));
  }
  view.controls.append(h("button", {
    type: "button", class: "chip",
    title: "Make the next message follow this turn (a new branch)",
    onclick: () => view.actions.branchFrom(view.turn.turn_id),
  }, icon(ICON_BRANCH), "Branch from here"));
}
