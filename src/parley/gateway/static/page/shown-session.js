// The session shown: opening it, reading it again (its record, history and tree) when
// something changed, noticing turns started elsewhere, and branching it.

import { ApiError, api, report } from "./api.js";
import { banner } from "./banners.js";
import { focusBox } from "./composer.js";
import { renderConversation } from "./conversation.js";
import { $ } from "./dom.js";
import { follow, followActive } from "./followed-turns.js";
import { oneLine } from "./format.js";
import { renderHeader } from "./header.js";
import { scrollToBottom, stickToEnd } from "./scroll.js";
import { newerFirst, renderSessions } from "./session-list.js";
import { state } from "./state.js";
import { TERMINAL } from "./status.js";
import { renderTree } from "./tree.js";

function stopStreams() {
  for (const stream of state.streams.values()) stream.stop();
  state.streams.clear();
}

export async function selectSession(id) {
  if (!id) return;
  if (id !== state.sessionId) {
    stopStreams();
    state.generation += 1;
    state.sessionId = id;
    state.session = null;
    state.history = [];
    state.tree = [];
    state.views.clear();
    $("turns").replaceChildren();
    stickToEnd();
  }
  if (location.hash !== `#s=${id}`) history.replaceState(history.state, "", `#s=${encodeURIComponent(id)}`);
  // For what marks the session shown elsewhere (a batch's line).
  document.dispatchEvent(new CustomEvent("parley:session", { detail: { id } }));
  renderSessions();
  renderHeader();
  await refreshSession({ scroll: true });
  focusBox();
}

/** The session, its history and its tree, read together; null when the read failed
 *  (and was reported). */
async function readSession(id, generation) {
  const base = `/v1/sessions/${encodeURIComponent(id)}`;
  try {
    const [session, historyTurns, treeTurns, compactions] = await Promise.all([
      api("GET", base).then((r) => r.data),
      api("GET", `${base}/history`).then((r) => r.data.turns || []),
      api("GET", `${base}/tree`).then((r) => r.data.turns || []),
      api("GET", `${base}/compactions`).then((r) => r.data.compactions || []),
    ]);
    return { session, historyTurns, treeTurns, compactions };
  } catch (err) {
    if (generation !== state.generation) return null;
    if (err instanceof ApiError && err.status === 404) {
      banner("That session is not there (or not this token's). Pick another one.");
      state.sessionId = null;
      history.replaceState(history.state, "", location.pathname + location.search);
      renderHeader();
      renderConversation();
      return null;
    }
    report(err, "Could not load the session");
    return null;
  }
}

export async function refreshSession({ scroll = false } = {}) {
  const id = state.sessionId;
  const generation = state.generation;
  if (!id) return;
  const read = await readSession(id, generation);
  if (!read || generation !== state.generation) return;
  const { session } = read;
  state.session = session;
  state.history = read.historyTurns;
  state.tree = read.treeTurns;
  state.compactions = read.compactions;
  const known = state.sessions.find((s) => s.id === id);
  if (known) Object.assign(known, session);
  // A conversation not listed yet takes its place; a batch's session is under its batch.
  else if (!session.batch_id) state.sessions = [...state.sessions, session].sort(newerFirst);
  renderSessions();
  renderHeader();
  renderTree();
  renderConversation();
  followActive();
  if (scroll) {
    showRecentSteps();
    scrollToBottom(true);
  }
}

/** On opening a session, the newest ended turns show their steps too (tool calls,
 *  steers), replayed from their stored events; older ones show their reply until asked. */
function showRecentSteps(count = 3) {
  const ended = state.history.filter((t) => TERMINAL.has(t.status)).slice(-count);
  for (const t of ended) {
    const view = state.views.get(t.turn_id);
    if (view && !view.detailed && !state.streams.has(t.turn_id)) follow(view, { fromStart: true });
  }
}

/** A turn started from elsewhere (another tab, a script) shows up within a few seconds:
 *  while the tab is visible and nothing is being followed, the tree is asked now and then. */
export async function watchTree() {
  const id = state.sessionId;
  if (!id || state.locked || document.visibilityState !== "visible" || state.streams.size) return;
  try {
    const { data } = await api("GET", `/v1/sessions/${encodeURIComponent(id)}/tree`);
    const sign = (turns) => turns.map((t) => `${t.turn_id}:${t.status}`).join();
    if (id === state.sessionId && sign(data.turns || []) !== sign(state.tree)) refreshSoon();
  } catch {
    // the next look will tell; a banner every few seconds would be noise
  }
}

let refreshTimer = null;
export function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => refreshSession(), 150);
}

export async function branchFrom(turnId) {
  const id = state.sessionId;
  try {
    await api("POST", `/v1/sessions/${encodeURIComponent(id)}/branch`, { turn_id: turnId });
    const t = state.tree.find((x) => x.turn_id === turnId);
    banner(`Branched: the next message follows “${oneLine(t?.prompt, 50)}”.`, { kind: "info", timeout: 4000 });
    await refreshSession();
    scrollToBottom(true);
  } catch (err) {
    report(err, "Could not branch");
  }
  focusBox();
}
