// The session list in the sidebar: the tenant's sessions by title, newest first, a page
// at a time, and the button that makes a new one.

import { api } from "./api.js";
import { report } from "./banners.js";
import { focusBox } from "./composer.js";
import { $, h } from "./dom.js";
import { fullTime, shortId, when } from "./format.js";
import { selectSession } from "./session.js";
import { closeSidebar } from "./sidebar.js";
import { state } from "./state.js";

const SESSIONS_PAGE = 50;

/** A session's name: its title (the first prompt's, unless one was set), else its
 *  workspace's name if it chose one. */
export function sessionTitle(s) {
  if (s.title) return s.title;
  if (s.workspace && s.workspace !== s.id) return s.workspace;
  return "New session";
}

export async function loadSessions({ more = false } = {}) {
  const before = more && state.sessions.length ? `&before=${encodeURIComponent(state.sessions.at(-1).id)}` : "";
  try {
    const { data } = await api("GET", `/v1/sessions?limit=${SESSIONS_PAGE}${before}`);
    const page = data.sessions || [];
    state.sessions = more ? [...state.sessions, ...page] : page;
    state.sessionsDone = page.length < SESSIONS_PAGE;
    renderSessions();
  } catch (err) {
    report(err, "Could not list the sessions");
  }
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
        onclick: () => { closeSidebar(); selectSession(s.id); },
      },
      h("span", { class: "session-name" }, sessionTitle(s)),
      h("span", { class: "session-meta" }, when(s.created_at), " · ", shortId(s.id)))));
  }
  $("sessions-empty").hidden = state.sessions.length > 0;
  $("sessions-more").hidden = state.sessionsDone;
}

export async function newSession() {
  try {
    const { data } = await api("POST", "/v1/sessions", {});
    state.sessions = [data, ...state.sessions.filter((s) => s.id !== data.id)];
    await selectSession(data.id);
    renderSessions();
    return data;
  } catch (err) {
    report(err, "Could not create a session");
    return null;
  } finally {
    focusBox();
  }
}
