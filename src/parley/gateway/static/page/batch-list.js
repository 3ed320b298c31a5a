// The batches in the sidebar, as batches.js read them: each with its progress, the open
// one with its lines, and a line that opened a session a button to it.  What a click
// asks for goes to the actions app.js wires.

import { $, h } from "./dom.js";
import { batchName, fullTime, when } from "./format.js";
import { state } from "./state.js";

// {toggleBatch(id), moreLines(id), openSession(id)}: what the list's clicks ask for.
let actions = null;

/** Give the list what its clicks ask for (app.js, once, before anything is shown). */
export function wireBatchList(given) {
  actions = given;
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
  const current = line.session_id === state.sessionId;
  return h("li", {},
    h("button", {
      type: "button", class: `batch-line${current ? " current" : ""}`,
      "aria-current": current ? "true" : undefined,
      title: `line ${line.line} · session ${line.session_id}`,
      onclick: () => actions.openSession(line.session_id),
    },
    h("span", { class: "line-name" }, label),
    h("span", { class: `line-status status-${status}` }, status)));
}

/** The batches of `batches` ({list, open, pages}: batches.js's), the open one with its
 *  lines as read. */
export function renderBatchList(batches) {
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
        onclick: () => actions.toggleBatch(b.id),
      },
      h("span", { class: "batch-name" },
        h("span", {}, `Batch ${batchName(b.id)}`),
        h("span", { class: `batch-status status-${b.status}` }, b.status.replace("_", " "))),
      progress(b),
      h("span", { class: "session-meta" }, when(new Date(b.created_at * 1000).toISOString()))));
    if (open) {
      const lines = batches.pages.flatMap((page) => page.lines);
      item.append(h("ul", { class: "batch-lines", "aria-label": `Lines of batch ${b.id}` },
        lines.map(lineItem)));
      if (batches.pages.at(-1)?.more) {
        item.append(h("button", {
          type: "button", class: "link-button",
          onclick: () => actions.moreLines(b.id),
        }, "More lines…"));
      }
    }
    list.append(item);
  }
}
