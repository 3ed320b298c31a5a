// The conversation: the session's turns from its root to its head, then any turn that
// has not ended yet, each shown by its TurnView (kept while the session is open).

import { updateComposer } from "./composer.js";
import { $ } from "./dom.js";
import { state } from "./state.js";
import { TERMINAL } from "./status.js";
import { shownHead } from "./tree.js";
import { TurnView } from "./turn/view.js";

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
  for (const t of [...shown, ...pending]) {
    let view = state.views.get(t.turn_id);
    if (!view) {
      view = new TurnView(t);
      state.views.set(t.turn_id, view);
    } else {
      view.update(t);
    }
    view.el.classList.toggle("elsewhere", elsewhere.has(t.turn_id));
    view.el.classList.toggle("is-head", t.turn_id === shownHead());
    wanted.push(view.el);
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
