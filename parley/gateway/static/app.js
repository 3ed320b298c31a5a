// parley's web page: sessions, batches, a session's tree, the conversation root → head,
// and the running turn streamed live.  Plain ES modules, no build step: this one wires the page's
// controls and starts it; page/ holds the rest, a module for each thing it shows or does.
// Every piece of model or user text goes into the page as a text node (never as markup),
// except the agent's replies: Markdown, rendered and sanitized by page/markdown.js.

import { loadBatches } from "./page/batches.js";
import { autosize, box, focusBox, send, updateComposer } from "./page/composer.js";
import { renderConversation } from "./page/conversation.js";
import { $ } from "./page/dom.js";
import { selectSession, refreshSoon, watchTree } from "./page/session.js";
import { contentChanged, letGo, onScroll, scrollToBottom } from "./page/scroll.js";
import { loadSessions, newSession } from "./page/sessions.js";
import { closeSidebar, toggleSidebar } from "./page/sidebar.js";
import { state } from "./page/state.js";
import { lock, takeToken } from "./page/token.js";
import { interrupt } from "./page/turn-actions.js";

function sessionFromHash() {
  const match = /(?:^#|&)s=([^&]+)/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
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
    for (const follower of state.followers.values()) follower.poke();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.sessionId && !state.locked) refreshSoon();
  });
}

async function main() {
  state.token = takeToken();
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
  loadBatches();
  const wanted = sessionFromHash() || state.sessions[0]?.id;
  if (wanted) await selectSession(wanted);
  else renderConversation();
  focusBox();
}

main();
