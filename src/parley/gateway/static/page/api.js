// The gateway's JSON API as the page calls it, with the tab's token, and its errors (told
// in a banner).

import { banner } from "./banners.js";
import { state } from "./state.js";
import { lock } from "./token.js";

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

/** `method path` (with `body` as JSON) as this tab: `{status, data, etag}`.  Given
 *  `ifNoneMatch`, the ETag of a copy the caller holds, a GET whose answer has not changed
 *  comes back as `{status: 304, data: null}`: the copy is current
 *  (docs/http.md#8-polling-with-etags).  `prefer`: a `Prefer` header ("stream": the turn it
 *  submits is followed next). */
export async function api(method, path, body, { ifNoneMatch = null, prefer = null } = {}) {
  const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  if (ifNoneMatch) headers["If-None-Match"] = ifNoneMatch;
  if (prefer) headers.Prefer = prefer;
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "NetworkError", "the gateway did not answer (is it running?)");
  }
  const etag = res.headers.get("ETag");
  if (res.status === 304) return { status: 304, data: null, etag };
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (res.status === 401) {
    lock("The gateway did not accept this tab's token.");
    throw new ApiError(401, "Unauthorized", data?.error?.message || "unauthorized");
  }
  if (!res.ok) {
    const e = data && data.error;
    throw new ApiError(res.status, e?.type || `HTTP ${res.status}`, e?.message || res.statusText);
  }
  return { status: res.status, data, etag };
}

/** Tell the reader in a banner that `what` failed, and why.  A token refused is not told
 *  here: the lock screen says it. */
export function report(err, what) {
  if (err instanceof ApiError && err.status === 401) return;
  const detail = err instanceof ApiError ? `${err.type}: ${err.message}` : String(err?.message || err);
  banner(what ? `${what} — ${detail}` : detail);
}
