// The gateway's JSON API as the page calls it, with the tab's token, and its errors.

import { state } from "./state.js";
import { lock } from "./token.js";

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

export async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "NetworkError", "the gateway did not answer (is it running?)");
  }
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
  return { status: res.status, data };
}
