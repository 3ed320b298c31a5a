// The tenant's batches in the sidebar (docs/batches.md): each with its progress, kept
// current while any runs; a batch opens to its lines, and a line opens as the ordinary
// session it is.

import { api } from "./api.js";
import { report } from "./banners.js";
import { $, h } from "./dom.js";
import { fullTime, shortId, when } from "./format.js";
import { selectSession } from "./session.js";
import { closeSidebar } from "./sidebar.js";

const BATCHES_PAGE = 20;
const LINES_PAGE = 50;
const POLL_MS = 1500;

const batches = { list: [], open: null, lines: [], linesDone: true, timer: null };

const ENDED = new Set(["completed", "cancelled", "failed", "expired"]);

export async function loadBatches() {
  try {
    const { data } = await api("GET", `/v1/batches?limit=${BATCHES_PAGE}`);
    batches.list = data.data || [];
  } catch (err) {
    report(err, "Could not list the batches");
    return;
  }
  if (batches.open) await loadLines(batches.open, { keep: true });
  renderBatches();
  clearTimeout(batches.timer);
  // Kept current while a batch runs; a batch made later shows at the next load.
  if (batches.list.some((b) => !ENDED.has(b.status))) {
    batches.timer = setTimeout(loadBatches, POLL_MS);
  }
}

async function loadLines(batchId, { more = false, keep = false } = {}) {
  const shown = more || keep ? batches.lines : [];
  const after = more && shown.length ? shown.at(-1).line : 0;
  const limit = keep ? Math.max(LINES_PAGE, shown.length) : LINES_PAGE;
  try {
    const { data } = await api("GET", `/v1/batches/${encodeURIComponent(batchId)}/lines?after=${after}&limit=${limit}`);
    const page = data.data || [];
    batches.lines = more ? [...shown, ...page] : page;
    batches.linesDone = !data.has_more;
  } catch (err) {
    report(err, "Could not list the batch's lines");
  }
}

async function toggle(batchId) {
  if (batches.open === batchId) {
    batches.open = null;
  } else {
    batches.open = batchId;
    await loadLines(batchId);
  }
  renderBatches();
}

function progress(b) {
  const counts = b.request_counts || { total: 0, completed: 0, failed: 0 };
  const ended = counts.completed + counts.failed;
  const extra = b.parley || {};
  const parts = [`${counts.completed} done`];
  if (counts.failed) parts.push(`${counts.failed} failed`);
  if (extra.running) parts.push(`${extra.running} running`);
  if (extra.throttled) parts.push(`${extra.throttled} waiting for capacity`);
  if (extra.waiting) parts.push(`${extra.waiting} waiting for an answer`);
  return h("div", { class: "batch-progress" },
    h("progress", {
      class: `batch-bar${counts.failed ? " has-failed" : ""}`,
      max: String(Math.max(counts.total, 1)), value: String(ended),
      "aria-label": `${ended} of ${counts.total} lines ended`,
    }),
    h("span", { class: "batch-counts" }, `${ended}/${counts.total} · ${parts.join(" · ")}`));
}

function lineItem(line) {
  const status = line.status || "refused";
  const label = line.custom_id ?? `line ${line.line}`;
  if (!line.session_id) {
    return h("li", { class: "batch-line refused", title: line.error?.message || "" },
      h("span", { class: "line-name" }, label),
      h("span", { class: `line-status status-${status}` }, line.error?.code || "refused"));
  }
  return h("li", {},
    h("button", {
      type: "button", class: "batch-line",
      title: `line ${line.line} · session ${line.session_id}`,
      onclick: () => { closeSidebar(); selectSession(line.session_id); },
    },
    h("span", { class: "line-name" }, label),
    h("span", { class: `line-status status-${status}` }, status)));
}

export function renderBatches() {
  const section = $("batches-section");
  section.hidden = batches.list.length === 0;
  const list = $("batch-list");
  list.replaceChildren();
  for (const b of batches.list) {
    const open = batches.open === b.id;
    const item = h("li", { class: `batch${open ? " open" : ""}` },
      h("button", {
        type: "button", class: "batch-item", "aria-expanded": String(open),
        title: `${b.id}\ncreated ${fullTime(new Date(b.created_at * 1000).toISOString())}`,
        onclick: () => toggle(b.id),
      },
      h("span", { class: "batch-name" },
        h("span", {}, `Batch ${shortId(b.id.replace(/^batch_/, ""))}`),
        h("span", { class: `batch-status status-${b.status}` }, b.status.replace("_", " "))),
      progress(b),
      h("span", { class: "session-meta" }, when(new Date(b.created_at * 1000).toISOString()))));
    if (open) {
      const lines = h("ul", { class: "batch-lines", "aria-label": `Lines of batch ${b.id}` },
        batches.lines.map(lineItem));
      item.append(lines);
      if (!batches.linesDone) {
        item.append(h("button", {
          type: "button", class: "link-button",
          onclick: async () => { await loadLines(b.id, { more: true }); renderBatches(); },
        }, "More lines…"));
      }
    }
    list.append(item);
  }
}
