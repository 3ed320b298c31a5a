// What the user does to turns: start one (a new message), resume one that stopped, and
// interrupt the running one.

import { ApiError, api } from "./api.js";
import { report } from "./banners.js";
import { focusBox } from "./composer.js";
import { renderConversation } from "./conversation.js";
import { activeView, follow } from "./following.js";
import { renderHeader } from "./header.js";
import { scrollToBottom, stickToEnd } from "./scroll.js";
import { refreshSession, refreshSoon } from "./session.js";
import { newSession, renderSessions } from "./sessions.js";
import { state } from "./state.js";
import { renderTree } from "./tree.js";

export async function startTurn(text) {
  if (!state.sessionId) {
    const made = await newSession();
    if (!made) return false;
  }
  const id = state.sessionId;
  try {
    const { data: turn } = await api("POST", `/v1/sessions/${encodeURIComponent(id)}/turns`, { prompt: text });
    if (id !== state.sessionId) return true;
    if (!state.tree.some((t) => t.turn_id === turn.turn_id)) state.tree.push(turn);
    stickToEnd();
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
    if (!same && again && !state.followers.has(turn.turn_id)) follow(again, { fromStart: true });
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
