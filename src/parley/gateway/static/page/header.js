// The header: the shown session's title and what it is (its id, its batch, workspace,
// turns), whether the turn the box steers is live, and the tab's title.

import { $, h } from "./dom.js";
import { batchName, shortId } from "./format.js";
import { sessionTitle } from "./session-list.js";
import { activeView, state } from "./state.js";

export function renderHeader() {
  const s = state.session || state.sessions.find((x) => x.id === state.sessionId);
  $("session-title").textContent = s ? sessionTitle(s) : "parley";
  const sub = $("session-sub");
  sub.replaceChildren();
  if (s) {
    sub.append(
      h("span", { title: s.id }, `session ${shortId(s.id)}`),
      s.batch_id ? h("span", { title: s.batch_id }, ` · a line of batch ${batchName(s.batch_id)}`) : "",
      s.workspace && s.workspace !== s.id ? h("span", {}, ` · workspace ${s.workspace}`) : "",
      state.tree.length ? h("span", {}, ` · ${state.tree.length} turn${state.tree.length === 1 ? "" : "s"}`) : "",
    );
  } else {
    sub.textContent = "durable, steerable agent conversations";
  }
  document.title = s ? `${sessionTitle(s)} · parley` : "parley";
}

/** The live mark: shown while a turn the box steers is followed, dimmed while its stream
 *  (re)connects. */
export function renderLiveState() {
  const el = $("live-state");
  el.replaceChildren();
  const view = activeView();
  if (!view) return;
  const stream = state.streams.get(view.turn.turn_id);
  const reconnecting = stream?.state === "reconnecting" || stream?.state === "connecting";
  el.append(h("span", { class: `live-dot${reconnecting ? " off" : ""}` }),
    reconnecting ? "reconnecting…" : "live");
}
