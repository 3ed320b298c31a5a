// What the user does to turns: send a message (a new turn, or a steer for the running
// one), resume a turn that stopped, interrupt the running one, and answer a call that
// waits for approval.

import { ApiError, api, report } from "./api.js";
import { autosize, box, focusBox } from "./composer.js";
import { renderConversation } from "./conversation.js";
import { $ } from "./dom.js";
import { follow } from "./followed-turns.js";
import { renderHeader } from "./header.js";
import { contentChanged, scrollToBottom, stickToEnd } from "./scroll.js";
import { renderSessions } from "./session-list.js";
import { newSession } from "./sessions.js";
import { refreshSession, refreshSoon } from "./shown-session.js";
import { activeView, state } from "./state.js";
import { renderTree } from "./tree.js";

export async function startTurn(text) {
  if (!state.sessionId) {
    const made = await newSession();
    if (!made) return false;
  }
  const id = state.sessionId;
  try {
    // The page follows the turn at once: "Prefer: stream" has the gateway start reading
    // it with the submission (docs/http.md).
    const { data: turn } = await api(
      "POST", `/v1/sessions/${encodeURIComponent(id)}/turns`, { prompt: text }, { prefer: "stream" },
    );
    if (id !== state.sessionId) return true;
    if (!state.tree.some((t) => t.turn_id === turn.turn_id)) state.tree.push(turn);
    stickToEnd();
    renderConversation();
    renderTree();
    renderSessions();
    renderHeader();
    const view = state.views.get(turn.turn_id);
    if (view && !state.streams.has(turn.turn_id)) follow(view, { fromStart: true });
    scrollToBottom(true);
    refreshSoon();
    return true;
  } catch (err) {
    report(err, "The message was not sent");
    return false;
  }
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
/** Send what the box holds: it steers the running turn, or starts the next one. */
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

export async function resumeTurn(view) {
  try {
    const { data: turn } = await api("POST", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}/resume`);
    stickToEnd();
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
    if (!same && again && !state.streams.has(turn.turn_id)) follow(again, { fromStart: true });
    scrollToBottom(true);
  } catch (err) {
    report(err, "Could not resume");
  }
  focusBox();
}

export async function interrupt() {
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

/** Answer a call of turn `turnId` that waits for approval `approvalId` (`decision`:
 *  "approve" or "deny"); whether the gateway took the answer. */
export async function answerApproval(turnId, approvalId, decision) {
  let taken = false;
  try {
    const path = `/v1/turns/${encodeURIComponent(turnId)}/approvals/${encodeURIComponent(approvalId)}`;
    await api("POST", path, { decision });
    taken = true;
  } catch (err) {
    report(err, "The answer was not taken");
  }
  focusBox();
  return taken;
}
