// The tab's token: taken from the URL the gateway printed, kept for this tab only, and
// the lock screen shown when there is none or the gateway refuses it.

import { $ } from "./dom.js";
import { state } from "./state.js";

const TOKEN_KEY = "parley.token";

/** The token from `?token=` (kept for this tab in sessionStorage and taken out of the
 *  address bar), or the one kept from before. */
export function takeToken() {
  const url = new URL(window.location.href);
  const given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    url.searchParams.delete("token");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

export function lock(detail) {
  state.locked = true;
  for (const stream of state.streams.values()) stream.stop();
  $("lock-detail").textContent = detail || "";
  $("lock").hidden = false;
}
