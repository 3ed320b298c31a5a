// The conversation: the session's turns from its root to its head, then any turn that
// has not ended yet, each shown by its TurnView (kept while the session is open).

import { updateComposer } from "./composer.js";
import { $ } from "./dom.js";
import { state } from "./state.js";
import { TERMINAL } from "./status.js";
import { shownHead } from "./tree.js";
import { TurnView } from "./turn/view.js";
import { compactionDivider } from "./compaction-divider.js";

// What a turn's controls ask for: the TurnView's actions.
let turnActions = null;

/** Give the turns shown what their controls ask for (app.js, once, before any is). */
export function wireConversation(actions) {
  turnActions = actions;
}

// Dividers by compaction id, kept like the views (a divider opened stays open).
const dividerEls = new Map();

/** The dividers of the compactions on the path shown, by the turn each goes under; the
 *  one reaching furthest (the newest among equals) is the one that applies. */
function dividersAfter(shown) {
  const depth = new Map(shown.map((t, i) => [t.turn_id, i]));
  const live = state.compactions.filter((c) => !c.dropped && depth.has(c.through_turn_id));
  let applies = null;
  for (const c of live) {
    const further = applies && depth.get(c.through_turn_id) - depth.get(applies.through_turn_id);
    if (!applies || further > 0 || (further === 0 && c.created_at >= applies.created_at)) applies = c;
  }
  const byTurn = new Map();
  for (const c of live) {
    const key = `${c.id}:${c === applies}`;
    if (!dividerEls.has(key)) dividerEls.set(key, compactionDivider(c, c === applies));
    const list = byTurn.get(c.through_turn_id) || [];
    list.push(dividerEls.get(key));
    byTurn.set(c.through_turn_id, list);
  }
  return byTurn;
}

export function renderConversation() {
  const list = $("turns");
  const shown = [...state.history];
  const onPath = new Set(shown.map((t) => t.turn_id));
  // A turn that has not ended takes its place in the history when it commits: until then
  // it shows after the head (or, if it hangs under another turn, as on another branch).
  const head = state.session?.head_turn_id ?? null;
  const pending = state.tree.filter((t) => !onPath.has(t.turn_id) && !TERMINAL.has(t.status));
  const elsewhere = new Set(pending
    .filter((t) => t.parent_id && t.parent_id !== head && !pending.some((p) => p.turn_id === t.parent_id))
    .map((t) => t.turn_id));
  const wanted = [];
  const dividers = dividersAfter(shown);
  for (const t of [...shown, ...pending]) {
    let view = state.views.get(t.turn_id);
    if (!view) {
      view = new TurnView(t, turnActions);
      state.views.set(t.turn_id, view);
    } else {
      view.update(t);
    }
    view.el.classList.toggle("elsewhere", elsewhere.has(t.turn_id));
    view.el.classList.toggle("is-head", t.turn_id === shownHead());
    wanted.push(view.el, ...(dividers.get(t.turn_id) || []));
  }
  // Views of turns not shown now stay cached (the GETs behind one render may straddle a
  // commit, and a turn seen live keeps its timeline when it comes back).
  const current = [...list.children];
  if (current.length !== wanted.length || current.some((el, i) => el !== wanted[i])) {
    list.replaceChildren(...wanted);
  }
  $("empty-state").hidden = wanted.length > 0;
  updateComposer();
}
