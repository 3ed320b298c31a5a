// The message box: it starts a turn, or steers the running one; its hint and buttons
// say which.

import { ApiError, api } from "./api.js";
import { report } from "./banners.js";
import { $, append, h } from "./dom.js";
import { activeView, renderLiveState } from "./following.js";
import { contentChanged, stickToEnd } from "./scroll.js";
import { state } from "./state.js";
import { startTurn } from "./turn-actions.js";

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

/** Steer the running turn with ``text``; true when it was taken (or, the turn having
 *  ended just now, started the next turn). */
async function steer(view, text) {
  try {
    await api("POST", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}/say`, { text });
    view.addPendingSteer(text);
    stickToEnd();
    contentChanged();
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 409 && err.type === "TurnEnded") {
      return startTurn(text); // it ended just now: the text starts the next turn
    }
    report(err, "The steer was not sent");
    return false;
  }
}

let sending = false;
export async function send() {
  const input = box();
  const text = input.value;
  if (!text.trim() || sending || state.locked) return;
  sending = true;
  $("send").disabled = true;
  input.value = "";
  autosize();
  try {
    const view = activeView();
    const ok = view ? await steer(view, text) : await startTurn(text);
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

export function autosize() {
  const input = box();
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
}
