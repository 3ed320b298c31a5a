// The turns followed live: a TurnStream per turn that has not ended (or whose steps are
// replayed), its events (and its sub-agents') applied to the turn's view, and what a
// turn's status change means for the page.

import { api, report } from "./api.js";
import { banner } from "./banners.js";
import { updateComposer } from "./composer.js";
import { renderLiveState } from "./header.js";
import { contentChanged } from "./scroll.js";
import { state } from "./state.js";
import { TERMINAL } from "./status.js";
import { renderTree } from "./tree.js";
import { TurnStream } from "./turn-stream.js";

// {sessionMoved()}: a followed turn started or ended, so the session's head and tree
// moved (shown-session.js's refreshSoon reads them again; it follows turns, so this
// module cannot import it).
let actions = null;

/** Give the followed turns what their moves ask for (app.js, once, before any is). */
export function wireFollowedTurns(given) {
  actions = given;
}

/** Follow every turn of the session that has not ended (normally at most one). */
export function followActive() {
  for (const t of state.tree) {
    if (!TERMINAL.has(t.status) && !state.streams.has(t.turn_id)) {
      const view = state.views.get(t.turn_id);
      if (view) follow(view, { fromStart: !view.detailed || !view.cursor });
    }
  }
}

export function follow(view, { fromStart = false } = {}) {
  const id = view.turn.turn_id;
  state.streams.get(id)?.stop();
  // On from where the view is only with the cursor of its last event: else from the start.
  if (!view.cursor) fromStart = true;
  if (fromStart) view.beginTimeline();
  // Replaying an ended turn from its start: the statuses it went through are history.
  // Followed on from its end, whatever comes (a resume) is news.
  view.replaying = fromStart && !view.running;
  view.live = true;
  view.refreshLive();
  const generation = state.generation;
  // Told its first state while it is being made: `stream` is read only once it ends.
  let stream = null;
  stream = new TurnStream(id, view.cursor, {
    lastKind: view.lastKind,
    onEvent: (event, cursor) => {
      if (generation !== state.generation) return;
      view.cursor = cursor;
      view.apply(event);
      if (event.kind === "agent_started") readAgentTask(view, event.data?.turn_id);
      contentChanged();
    },
    onState: (s) => {
      if (generation !== state.generation) return;
      streamState(view, stream, s);
    },
    onGone: () => banner("That turn is no longer there."),
  });
  state.streams.set(id, stream);
  renderLiveState();
  updateComposer();
  if (view.status === "waiting") loadApprovals(view);
  return stream;
}

/** A stream's connection changed: the turn's note says so, and a stream over lets go of
 *  the turn. */
function streamState(view, stream, s) {
  if (s === "reconnecting") view.setNote("reconnecting…");
  else if (s === "live" || s === "ended") view.setNote("");
  if (s === "ended" || s === "gone") {
    const replayed = view.replaying;
    view.live = false;
    view.replaying = false;
    view.refreshLive();
    const id = view.turn.turn_id;
    if (state.streams.get(id) === stream) state.streams.delete(id);
    updateComposer();
    // A turn that ended just now moved the head (one still ended, nothing did).
    if (!replayed && stream.received) actions.sessionMoved();
  }
  renderLiveState();
}

/** A child's task is its turn's prompt: read once, for its card (the call's arguments
 *  reach the parent's stream only when its step commits, after every child ended). */
async function readAgentTask(view, turnId) {
  if (!turnId) return;
  try {
    const { data } = await api("GET", `/v1/turns/${encodeURIComponent(turnId)}`);
    view.agentTask(turnId, data?.prompt);
  } catch {
    // Only a label: the card shows the child without it.
  }
}

async function loadApprovals(view) {
  try {
    const { data } = await api("GET", `/v1/turns/${encodeURIComponent(view.turn.turn_id)}`);
    for (const a of data.pending_approvals || []) view.approval(a);
    view.refreshLive();
    contentChanged();
  } catch (err) {
    report(err, "Could not read the turn's approvals");
  }
}

export async function showSteps(view) {
  if (state.streams.has(view.turn.turn_id)) return;
  follow(view, { fromStart: true });
}

/** Told by a view whose status changed. */
export function turnStatusChanged(view) {
  const forAgents = view.turn.waiting_for === "agents"; // its children's ends wake it
  if (view.status === "waiting" && view.approvals.size === 0 && !forAgents) loadApprovals(view);
  const inTree = state.tree.find((t) => t.turn_id === view.turn.turn_id);
  if (inTree && inTree.status !== view.status) {
    const started = inTree.status === "queued";
    inTree.status = view.status;
    renderTree();
    // Started: it has its place in the tree now, under the head (and the head mark
    // moves to it); the tree as read at submission did not say where.
    if (started && !TERMINAL.has(view.status)) actions.sessionMoved();
  }
  updateComposer();
  if (TERMINAL.has(view.status)) actions.sessionMoved();
}
