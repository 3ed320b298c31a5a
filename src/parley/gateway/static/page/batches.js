// The tenant's batches for the sidebar (docs/batches.md; batch-list.js shows them): the
// newest, and the lines of the one opened, a page at a time.  loadBatches reads them
// again only if they changed (If-None-Match), which the sidebar's watch
// (sidebar-polling.js) asks for every few seconds.

import { api, report } from "./api.js";
import { renderBatchList } from "./batch-list.js";

const BATCHES_PAGE = 20;
const LINES_PAGE = 50;

// `pages`: the open batch's lines as read, a page each ({after, tag, lines, more}).
const batches = { list: [], tag: null, open: null, pages: [] };

const ENDED = new Set(["completed", "cancelled", "failed", "expired"]);

/** Whether a batch listed has not ended (its counts still move). */
export function batchesRunning() {
  return batches.list.some((b) => !ENDED.has(b.status));
}

/** The newest batches, and the open one's lines while it runs, read again where they
 *  changed, and shown.  `quiet`: a failure is left to the next look. */
export async function loadBatches({ quiet = false } = {}) {
  let answer;
  try {
    answer = await api("GET", `/v1/batches?limit=${BATCHES_PAGE}`, undefined, { ifNoneMatch: batches.tag });
  } catch (err) {
    if (!quiet) report(err, "Could not list the batches");
    return;
  }
  let changed = answer.status !== 304;
  if (changed) {
    batches.tag = answer.etag;
    batches.list = answer.data.data || [];
  }
  const open = batches.list.find((b) => b.id === batches.open);
  // Its lines move while it runs (and once more as it ends).
  if (open && (changed || !ENDED.has(open.status))) {
    changed = (await readLines(open.id)) || changed;
  }
  if (changed) renderBatches();
}

/** The open batch's lines page by page, each read again if it changed; whether any did. */
async function readLines(batchId) {
  let changed = false;
  for (const page of batches.pages) {
    const fresh = await linesPage(batchId, page.after, page.tag);
    if (batches.open !== batchId || !fresh) return changed;
    if (fresh.tag !== page.tag) {
      Object.assign(page, fresh);
      changed = true;
    }
  }
  return changed;
}

/** A page of a batch's lines after line `after`; the same tag back when it is as `tag`
 *  said; null when it could not be read (and, if `loud`, said so). */
async function linesPage(batchId, after, tag = null, loud = false) {
  const path = `/v1/batches/${encodeURIComponent(batchId)}/lines?after=${after}&limit=${LINES_PAGE}`;
  try {
    const { status, data, etag } = await api("GET", path, undefined, { ifNoneMatch: tag });
    if (status === 304) return { after, tag };
    return { after, tag: etag, lines: data.data || [], more: Boolean(data.has_more) };
  } catch (err) {
    if (loud) report(err, "Could not list the batch's lines");
    return null;
  }
}

async function openLines(batchId, { more = false } = {}) {
  const last = batches.pages.at(-1);
  const after = more && last?.lines.length ? last.lines.at(-1).line : 0;
  const page = await linesPage(batchId, after, null, true);
  if (!page || batches.open !== batchId) return;
  batches.pages = more ? [...batches.pages, page] : [page];
}

/** Open the batch's lines, or close them if they are open. */
export async function toggleBatch(batchId) {
  if (batches.open === batchId) {
    batches.open = null;
    batches.pages = [];
  } else {
    batches.open = batchId;
    batches.pages = [];
    await openLines(batchId);
  }
  renderBatches();
}

/** The open batch's next page of lines, below those shown. */
export async function moreLines(batchId) {
  await openLines(batchId, { more: true });
  renderBatches();
}

/** Show the batches as read (again after a session is opened: its line is marked). */
export function renderBatches() {
  renderBatchList(batches);
}
