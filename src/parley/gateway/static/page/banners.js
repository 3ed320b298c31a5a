// Banners: what went wrong (or is worth a word) at the top of the conversation (an API
// failure is told by api.js's report).

import { $, h } from "./dom.js";

export function banner(message, { kind = "error", timeout = 9000 } = {}) {
  const stack = $("banners");
  // The same message twice in a row is one banner.
  for (const old of stack.children) {
    if (old.dataset.message === message) old.remove();
  }
  const close = h("button", { type: "button", class: "banner-close", "aria-label": "Dismiss" }, "×");
  const el = h("div", { class: `banner ${kind}`, dataset: { message } },
    h("span", { class: "banner-text" }, message), close);
  close.addEventListener("click", () => el.remove());
  stack.append(el);
  while (stack.children.length > 3) stack.firstElementChild.remove();
  if (timeout) setTimeout(() => el.remove(), timeout);
}
