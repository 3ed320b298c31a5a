// The session list in the sidebar: the tenant's conversations as sessions.js read them,
// by title, newest first.  A pick is reported to the action app.js wires.

import { $, h } from "./dom.js";
import { fullTime, shortId, when } from "./format.js";
import { state } from "./state.js";

// {openSession(id)}: what a pick asks for.
let actions = null;

/** Give the list what a pick asks for (app.js, once, before anything is shown). */
export function wireSessionList(given) {
  actions = given;
}

/** A session's name: its title (the first prompt's, unless one was set), else its
 *  workspace's name if it chose one. */
export function sessionTitle(s) {
  if (s.title) return s.title;
  if (s.workspace && s.workspace !== s.id) return s.workspace;
  return "New session";
}

/** Sessions in the list's order: negative when `a` comes before `b` (newer). */
export function newerFirst(a, b) {
  const at = Date.parse(a.created_at);
  const bt = Date.parse(b.created_at);
  if (at !== bt) return bt - at;
  return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
}

export function renderSessions() {
  const list = $("session-list");
  list.replaceChildren();
  for (const s of state.sessions) {
    const current = s.id === state.sessionId;
    list.append(h("li", {},
      h("button", {
        type: "button", class: `session-item${current ? " current" : ""}`,
        "aria-current": current ? "true" : undefined,
        title: `${s.id}\ncreated ${fullTime(s.created_at)}`,
        onclick: () => actions.openSession(s.id),
      },
      h("span", { class: "session-name" }, sessionTitle(s)),
      h("span", { class: "session-meta" }, when(s.created_at), " · ", shortId(s.id)))));
  }
  $("sessions-empty").hidden = state.sessions.length > 0;
  $("sessions-more").hidden = state.sessionsDone;
}
