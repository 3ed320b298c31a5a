// Text for the page: short ids, times as a reader says them, one-line previews.

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

/** A batch as the page names it: its id's first characters after `batch_`. */
export function batchName(id) {
  return shortId(String(id).replace(/^batch_/, ""));
}

export function when(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  if (s < 7 * 86400) return `${Math.round(s / 86400)} d ago`;
  return new Date(t).toLocaleDateString();
}

export function fullTime(iso) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? "" : new Date(t).toLocaleString();
}

export function oneLine(text, max = 80) {
  const flat = String(text ?? "").replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}
