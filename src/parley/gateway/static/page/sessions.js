// The tenant's conversations for the sidebar (session-list.js shows them): read a page
// at a time, newest first (a batch's sessions are under their batch: batches.js), kept
// current by refreshSessions; and a new one made.

import { api, report } from "./api.js";
import { focusBox } from "./composer.js";
import { newerFirst, renderSessions } from "./session-list.js";
import { selectSession } from "./shown-session.js";
import { state } from "./state.js";

const SESSIONS_PAGE = 50;
const CONVERSATIONS = `/v1/sessions?batch_sessions=false&limit=${SESSIONS_PAGE}`;

let newestTag = null; // the ETag of the newest page as last read

export async function loadSessions({ more = false } = {}) {
  const before = more && state.sessions.length ? `&before=${encodeURIComponent(state.sessions.at(-1).id)}` : "";
  try {
    const { data, etag } = await api("GET", CONVERSATIONS + before);
    const page = data.sessions || [];
    if (!more) newestTag = etag;
    state.sessions = more ? [...state.sessions, ...page] : page;
    state.sessionsDone = page.length < SESSIONS_PAGE;
    renderSessions();
  } catch (err) {
    report(err, "Could not list the sessions");
  }
}

/** The newest page read again if it changed (a conversation made elsewhere, a title
 *  given), in place of the one shown; older pages read since stay below it.  Quiet: a
 *  look that fails is followed by another. */
export async function refreshSessions() {
  let answer;
  try {
    answer = await api("GET", CONVERSATIONS, undefined, { ifNoneMatch: newestTag });
  } catch {
    return;
  }
  if (answer.status === 304) return;
  newestTag = answer.etag;
  const page = answer.data.sessions || [];
  const olderShown = state.sessions.length > SESSIONS_PAGE;
  state.sessions = withOlderPages(page, state.sessions);
  state.sessionsDone = page.length < SESSIONS_PAGE || (olderShown && state.sessionsDone);
  renderSessions();
}

/** The newest page, then whatever was shown below where it ends. */
function withOlderPages(page, shown) {
  if (page.length < SESSIONS_PAGE) return page; // every conversation there is
  const last = page.at(-1);
  const listed = new Set(page.map((s) => s.id));
  return [...page, ...shown.filter((s) => !listed.has(s.id) && newerFirst(s, last) > 0)];
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
