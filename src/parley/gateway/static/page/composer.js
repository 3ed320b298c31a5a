// The message box: whether it starts a turn or steers the running one, as its hint,
// placeholder and buttons say; its height follows what is typed.  What it sends is
// turn-actions.js's.

import { $, append, h } from "./dom.js";
import { renderLiveState } from "./header.js";
import { activeView, state } from "./state.js";

export const box = () => $("message");

export function focusBox() {
  if (window.matchMedia("(pointer: coarse)").matches) return; // no keyboard popping up
  box().focus({ preventScroll: true });
}

export function updateComposer() {
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

export function autosize() {
  const input = box();
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
}
