// parley's web page: conversations and batches (kept current), a session's tree, the
// conversation root → head, and the running turn streamed live.  Plain ES modules, no
// build step: this one wires the page and starts it; page/ holds the rest, a module for
// each thing it shows or does, in layers that import only downwards (CONTRIBUTING.md,
// tests/unit/test_page_layers.py): controllers own the state and talk to the gateway;
// views render and report what the user did to the actions wired here, never importing
// a controller.
// Every piece of model or user text goes into the page as a text node (never as markup),
// except the agent's replies: Markdown, rendered and sanitized by page/markdown.js.

import { wireBatchList } from "./page/batch-list.js";
import { loadBatches, moreLines, renderBatches, toggleBatch } from "./page/batches.js";
import { autosize, box, focusBox, updateComposer } from "./page/composer.js";
import { renderConversation, wireConversation } from "./page/conversation.js";
import { $ } from "./page/dom.js";
import { showSteps, turnStatusChanged, wireFollowedTurns } from "./page/followed-turns.js";
import { contentChanged, letGo, onScroll, scrollToBottom } from "./page/scroll.js";
import { wireSessionList } from "./page/session-list.js";
import { loadSchedules } from "./page/schedules.js";
import { loadSessions, newSession } from "./page/sessions.js";
import { branchFrom, refreshSoon, selectSession, watchTree } from "./page/shown-session.js";
import { keepSidebarCurrent } from "./page/sidebar-polling.js";
import { closeSidebar, toggleSidebar } from "./page/sidebar.js";
import { state } from "./page/state.js";
import { lock, takeToken } from "./page/token.js";
import { wireTree } from "./page/tree.js";
import { answerApproval, interrupt, resumeTurn, send, startTurn } from "./page/turn-actions.js";

function sessionFromHash() {
  const match = /(?:^#|&)s=([^&]+)/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

/** What the views report (a pick, a turn's control) and the followed turns tell, to the
 *  controllers that act on it. */
function wireActions() {
  const openSession = (id) => { closeSidebar(); selectSession(id); };
  wireSessionList({ openSession });
  wireBatchList({ openSession, toggleBatch, moreLines });
  wireTree({ branchFrom });
  wireConversation({
    startTurn, resumeTurn, showSteps, branchFrom, answerApproval, turnStatusChanged,
    compacted: refreshSoon,
  });
  wireFollowedTurns({ sessionMoved: refreshSoon });
}

function wireComposer() {
  const input = box();
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      send();
    }
  });
  input.addEventListener("input", autosize);
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("interrupt").addEventListener("click", interrupt);
  for (const suggestion of document.querySelectorAll(".suggestion")) {
    suggestion.addEventListener("click", () => {
      box().value = suggestion.dataset.prompt;
      send();
    });
  }
}

function wireSidebar() {
  $("new-session").addEventListener("click", () => { closeSidebar(); newSession(); });
  $("sessions-more").addEventListener("click", () => loadSessions({ more: true }));
  $("sidebar-toggle").addEventListener("click", toggleSidebar);
  $("main").addEventListener("click", (e) => {
    if (document.body.classList.contains("sidebar-open") && !$("sidebar-toggle").contains(e.target)) {
      closeSidebar();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && document.body.classList.contains("sidebar-open")) closeSidebar();
  });
}

function wireScrolling() {
  $("jump").addEventListener("click", () => scrollToBottom(true));
  const conv = $("conversation");
  conv.addEventListener("scroll", () => onScroll(conv), { passive: true });
  // Whatever makes the conversation grow (an event, a refresh, a card opened at the end)
  // keeps the end in view while the reader is there.
  new ResizeObserver(() => contentChanged()).observe($("turns"));
  conv.addEventListener("wheel", (e) => { if (e.deltaY < 0) letGo(); }, { passive: true });
}

function wireWindow() {
  window.addEventListener("hashchange", () => {
    const id = sessionFromHash();
    if (id && id !== state.sessionId) selectSession(id);
  });
  window.addEventListener("online", () => {
    for (const stream of state.streams.values()) stream.poke();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.sessionId && !state.locked) refreshSoon();
  });
  // The batch line shown is marked in its batch.
  document.addEventListener("parley:session", () => renderBatches());
}

async function main() {
  state.token = takeToken();
  wireActions();
  wireComposer();
  wireSidebar();
  wireScrolling();
  wireWindow();
  updateComposer();
  setInterval(watchTree, 8000);

  if (!state.token) {
    lock("");
    return;
  }
  await loadSessions();
  if (state.locked) return;
  loadSchedules();
  loadBatches().then(keepSidebarCurrent);
  // Without one in the URL, the newest conversation (the list has no batch's sessions).
  const wanted = sessionFromHash() || state.sessions[0]?.id;
  if (wanted) await selectSession(wanted);
  else renderConversation();
  focusBox();
}

main();
