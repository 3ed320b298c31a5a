// Following turns live: a Follower per turn that has not ended (or whose steps are
// replayed), its events applied to the turn's view, and the live state in the header.

import { api } from "./api.js";
import { banner, report } from "./banners.js";
import { updateComposer } from "./composer.js";
import { $, h } from "./dom.js";
import { Follower } from "./follower.js";
import { contentChanged } from "./scroll.js";
import { refreshSoon } from "./session.js";
import { state } from "./state.js";
import { TERMINAL } from "./status.js";
import { renderTree } from "./tree.js";

/** Follow every turn of the session that has not ended (normally at most one). */
export function followActive() {
  for (const t of state.tree) {
    if (!TERMINAL.has(t.status) && !state.followers.has(t.turn_id)) {
      const view = state.views.get(t.turn_id);
      if (view) follow(view, { fromStart: !view.detailed || view.lastSeq === 0 });
    }
  }
}

export function follow(view, { fromStart = false } = {}) {
  const id = view.turn.turn_id;
  state.followers.get(id)?.stop();
  if (fromStart) view.beginTimeline();
  // Replaying an ended turn from its start: the statuses it went through are history.
  // Followed on from its end, whatever comes (a resume) is news.
  view.replaying = fromStart && !view.running;
  view.live = true;
  view.refreshLive();
  const generation = state.generation;
  // Told its first state while it is being made: `follower` is read only once it ends.
  let follower = null;
  follower = new Follower(id, view.lastSeq, {
    lastKind: view.lastKind,
    onEvent: (event) => {
      if (generation !== state.generation) return;
      view.apply(event);
      contentChanged();
    },
    onState: (s) => {
      if (generation !== state.generation) return;
      followerState(view, follower, s);
    },
    onGone: () => banner("That turn is no longer there."),
  });
  state.followers.set(id, follower);
  renderLiveState();
  updateComposer();
  if (view.status === "waiting") loadApprovals(view);
  return follower;
}

/** A follower's connection changed: the turn's note says so, and a stream over lets go
 *  of the turn. */
function followerState(view, follower, s) {
  if (s === "reconnecting") view.setNote("reconnecting…");
  else if (s === "live" || s === "ended") view.setNote("");
  if (s === "ended" || s === "gone") {
    const replayed = view.replaying;
    view.live = false;
    view.replaying = false;
    view.refreshLive();
    const id = view.turn.turn_id;
    if (state.followers.get(id) === follower) state.followers.delete(id);
    updateComposer();
    // A turn that ended just now moved the head (one still ended, nothing did).
    if (!replayed && follower.received) refreshSoon();
  }
  renderLiveState();
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
  if (state.followers.has(view.turn.turn_id)) return;
  follow(view, { fromStart: true });
}

/** Called by a view whose status changed. */
export function onTurnStatus(view) {
  if (view.status === "waiting" && view.approvals.size === 0) loadApprovals(view);
  const inTree = state.tree.find((t) => t.turn_id === view.turn.turn_id);
  if (inTree && inTree.status !== view.status) {
    const started = inTree.status === "queued";
    inTree.status = view.status;
    renderTree();
    // Started: it has its place in the tree now, under the head (and the head mark
    // moves to it); the tree as read at submission did not say where.
    if (started && !TERMINAL.has(view.status)) refreshSoon();
  }
  updateComposer();
  if (TERMINAL.has(view.status)) refreshSoon();
}

/** The turn the message box steers: the newest followed turn that has not ended. */
export function activeView() {
  let found = null;
  for (const [id, follower] of state.followers) {
    const view = state.views.get(id);
    if (view && view.running && !follower.done) found = view;
  }
  return found;
}

export function renderLiveState() {
  const el = $("live-state");
  el.replaceChildren();
  const view = activeView();
  if (!view) return;
  const follower = state.followers.get(view.turn.turn_id);
  const reconnecting = follower?.state === "reconnecting" || follower?.state === "connecting";
  el.append(h("span", { class: `live-dot${reconnecting ? " off" : ""}` }),
    reconnecting ? "reconnecting…" : "live");
}
