// The header: the shown session's title and what it is (its id, workspace, turns), and
// the tab's title.

import { $, h } from "./dom.js";
import { shortId } from "./format.js";
import { sessionTitle } from "./sessions.js";
import { state } from "./state.js";

export function renderHeader() {
  const s = state.session || state.sessions.find((x) => x.id === state.sessionId);
  $("session-title").textContent = s ? sessionTitle(s) : "parley";
  const sub = $("session-sub");
  sub.replaceChildren();
  if (s) {
    sub.append(
      h("span", { title: s.id }, `session ${shortId(s.id)}`),
      s.workspace && s.workspace !== s.id ? h("span", {}, ` · workspace ${s.workspace}`) : "",
      state.tree.length ? h("span", {}, ` · ${state.tree.length} turn${state.tree.length === 1 ? "" : "s"}`) : "",
    );
  } else {
    sub.textContent = "durable, steerable agent conversations";
  }
  document.title = s ? `${sessionTitle(s)} · parley` : "parley";
}
