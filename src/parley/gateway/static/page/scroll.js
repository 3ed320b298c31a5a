// Scrolling the conversation: the view follows new output while the reader is at the
// bottom; once they scroll up it stays where they are (and offers a jump back) until
// they return to the bottom.

import { $ } from "./dom.js";

let stick = true;
let scrollQueued = false;
let lastTop = 0;
let lastHeight = 0;

/** Follow new output again (the reader sent something, or opened another session). */
export function stickToEnd() {
  stick = true;
}

/** Stop following new output (the reader scrolled up). */
export function letGo() {
  stick = false;
}

function nearBottom(el, slack = 8) {
  return el.scrollHeight - el.scrollTop - el.clientHeight <= slack;
}

export function scrollToBottom(force = false) {
  if (force) stick = true;
  const conv = $("conversation");
  conv.scrollTop = conv.scrollHeight;
  lastTop = conv.scrollTop;
  lastHeight = conv.scrollHeight;
  $("jump").hidden = true;
}

export function onScroll(conv) {
  const top = conv.scrollTop;
  const height = conv.scrollHeight;
  // A move up is the reader's doing only if the content kept its height: content that
  // shrinks pulls the position up too (and content growing below never scrolls).
  if (top < lastTop - 1 && height === lastHeight) stick = false;
  if (nearBottom(conv)) stick = true;
  lastTop = top;
  lastHeight = height;
  if (stick) $("jump").hidden = true;
}

export function contentChanged() {
  if (scrollQueued) return;
  scrollQueued = true;
  requestAnimationFrame(() => {
    scrollQueued = false;
    const conv = $("conversation");
    if (conv.scrollHeight <= conv.clientHeight + 8) stick = true;
    if (stick) scrollToBottom();
    else $("jump").hidden = false;
  });
}
