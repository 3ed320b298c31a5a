// The session's tree in the sidebar: every turn on every branch, the path shown, and the
// head (the turn the next message follows), each with a "branch from here".

import { banner } from "./banners.js";
import { $, h, icon } from "./dom.js";
import { oneLine } from "./format.js";
import { ICON_BRANCH } from "./icons.js";
import { closeSidebar } from "./sidebar.js";
import { state } from "./state.js";
import { delayedLabel, STATUS_LABEL, TERMINAL } from "./status.js";

// {branchFrom(turnId)}: what a turn's "branch from here" asks for.
let actions = null;

/** Give the tree what its buttons ask for (app.js, once, before it is shown). */
export function wireTree(given) {
  actions = given;
}

/** The turn the next message follows: the stored head, or the turn that started under
 *  it and has not ended (a turn takes its place under the head when it starts, and the
 *  next one hangs under it), so the mark moves when a turn starts, not when it ends. */
export function shownHead() {
  let head = state.session?.head_turn_id ?? null;
  const seen = new Set();
  for (;;) {
    const next = state.tree.find((t) => (t.parent_id ?? null) === head && !seen.has(t.turn_id)
      && t.status !== "queued" && !TERMINAL.has(t.status));
    if (!next) return head;
    seen.add(next.turn_id);
    head = next.turn_id;
  }
}

/** The tree's turns by parent (null: a root), oldest first, and the queued turns that
 *  have no place in it yet (they take it when they start). */
function byParent() {
  const ids = new Set(state.tree.map((t) => t.turn_id));
  const children = new Map();
  const waiting = [];
  for (const t of state.tree) {
    if (!t.parent_id && t.status === "queued" && state.tree.length > 1) {
      waiting.push(t);
      continue;
    }
    const parent = t.parent_id && ids.has(t.parent_id) ? t.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(t);
  }
  for (const list of children.values()) {
    list.sort((a, b) => String(a.created_at).localeCompare(String(b.created_at)));
  }
  return { children, waiting };
}

function nodeRow(t, { head, onPath }) {
  const isHead = t.turn_id === head;
  return h("li", {
    class: `node-row${onPath.has(t.turn_id) ? " on-path" : ""}${isHead ? " head" : ""}`,
    dataset: { turnId: t.turn_id },
    "aria-current": isHead ? "true" : undefined,
    title: `${t.prompt ?? ""}${t.reply ? `\n→ ${oneLine(t.reply, 200)}` : ""}\n(${delayedLabel(t) || STATUS_LABEL[t.status] || t.status})`,
  },
  h("span", { class: `dot status-${t.status}`, "aria-hidden": "true" }),
  h("button", {
    type: "button", class: "node-label",
    onclick: () => showTurn(t.turn_id),
  }, oneLine(t.prompt, 60) || "(empty prompt)"),
  isHead ? h("span", { class: "head-mark", title: "the head: the next message follows this turn" }, "head") : "",
  h("button", {
    type: "button", class: "icon-button branch",
    "aria-label": "Branch from here",
    title: "Branch from here: the next message follows this turn",
    onclick: () => actions.branchFrom(t.turn_id),
  }, icon(ICON_BRANCH)));
}

/** A chain of single children stays at one level; where a turn has several children,
 *  each of them starts an indented branch. */
function chain(first, children, marks) {
  const list = h("ul", { class: "chain" });
  let t = first;
  while (t) {
    list.append(nodeRow(t, marks));
    const kids = children.get(t.turn_id) || [];
    if (kids.length === 1) {
      t = kids[0];
      continue;
    }
    if (kids.length > 1) {
      list.append(h("li", { class: "fork" },
        kids.map((k) => h("div", { class: `branch-line${marks.onPath.has(k.turn_id) ? " on-path" : ""}` },
          chain(k, children, marks)))));
    }
    t = null;
  }
  return list;
}

export function renderTree() {
  const section = $("tree-section");
  const tree = $("tree");
  tree.replaceChildren();
  section.hidden = !state.sessionId || state.tree.length === 0;
  const marks = { head: shownHead(), onPath: new Set(state.history.map((t) => t.turn_id)) };
  const { children, waiting } = byParent();
  for (const rootTurn of children.get(null) || []) tree.append(chain(rootTurn, children, marks));
  if (waiting.length) {
    const list = h("ul", { class: "chain waiting" });
    for (const t of waiting) list.append(nodeRow(t, marks));
    tree.append(list);
  }
}

export function showTurn(turnId) {
  const view = state.views.get(turnId);
  if (view && view.el.isConnected) {
    view.el.scrollIntoView({ behavior: "smooth", block: "center" });
    view.el.classList.remove("flash");
    void view.el.offsetWidth;
    view.el.classList.add("flash");
    closeSidebar();
  } else {
    banner("That turn is on another branch. “Branch from here” makes it part of the conversation.",
      { kind: "info", timeout: 5000 });
  }
}
