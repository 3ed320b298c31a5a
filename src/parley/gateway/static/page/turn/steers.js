// Steers in a turn: the user's words sent while it runs, shown pending, delivered (above
// the step they reached) or undelivered (with an offer to send them as a new message).

import { h } from "../dom.js";

/** A steer of `view`'s turn as `status` shows it. */
export function steerBubble(view, text, status) {
  const label = {
    delivered: "steer · delivered",
    pending: "steer · waits for the next step",
    undelivered: "steer · not delivered: the turn stopped first",
  }[status];
  const extra = status === "undelivered" ? h("button", {
    type: "button", class: "chip small",
    onclick: (e) => { e.currentTarget.remove(); view.actions.startTurn(text); },
  }, "Send as a new message") : "";
  return h("div", { class: `row user-row steer-row ${status}` },
    h("div", { class: "bubble user steer" },
      h("div", { class: "steer-label" }, label),
      h("div", { class: "text", text }),
      extra));
}

export function addPendingSteer(view, text) {
  const el = steerBubble(view, text, "pending");
  view.body.append(el);
  view.pendingSteers.push({ text, el });
  view.refreshLive();
}

export function onSteer(view, d) {
  const pending = view.pendingSteers.findIndex((p) => p.text === d.text);
  if (pending >= 0) {
    const [p] = view.pendingSteers.splice(pending, 1);
    p.el.remove();
  }
  // Announced once the step whose request carried it committed, after that step's
  // tokens: shown above the step it reached.
  const bubble = steerBubble(view, d.text, "delivered");
  const reached = view.blocks.get(d.step);
  if (reached) reached.el.before(bubble);
  else view.body.append(bubble);
}
