// A turn's reply: the bubble of rendered Markdown shown when its steps are not, and
// what its `end` event shows (the reply, an error, steers that came too late, text that
// was streamed but never kept).

import { h } from "../dom.js";
import { renderMarkdown } from "../markdown.js";
import { steerBubble } from "./steers.js";

/** A reply as a bubble of rendered Markdown. */
export function replyBubble(text) {
  const el = h("div", { class: "text" });
  renderMarkdown(el, text);
  return h("div", { class: "bubble agent" }, el);
}

/** The turn's side before its steps are shown: the reply, or dots while it works. */
export function renderSummary(view) {
  view.body.replaceChildren();
  const t = view.turn;
  if (t.reply) {
    view.body.append(replyBubble(t.reply));
  } else if (view.running) {
    view.body.append(view.typing);
  } else {
    view.body.append(h("div", { class: "bubble agent muted" },
      h("div", { class: "text", text: "No reply." })));
  }
}

export function onEnd(view, d) {
  view.turn.reply = d.reply ?? null;
  const texts = [...view.blocks.values()].map((b) => b.source.trim());
  if (d.reply && !texts.includes(d.reply.trim())) view.body.append(replyBubble(d.reply));
  if (d.error) {
    view.body.append(h("div", { class: "turn-error", role: "note", text: d.error }));
  }
  for (const text of d.undelivered || []) showUndelivered(view, text);
  for (const block of view.blocks.values()) {
    // Text streamed in a step that never committed: display-only, never replayed.
    if (!block.committed && block.streamed && !block.el.classList.contains("partial")) {
      block.el.classList.add("partial");
      block.bubble.after(h("div", { class: "partial-tag" },
        "interrupted here: this text is shown, not kept for the model"));
    }
  }
  for (const card of view.approvals.values()) card.classList.add("closed");
  view.setStatus(d.outcome || "finished");
}

function showUndelivered(view, text) {
  const i = view.pendingSteers.findIndex((p) => p.text === text);
  if (i >= 0) {
    const [p] = view.pendingSteers.splice(i, 1);
    p.el.replaceWith(steerBubble(view, text, "undelivered"));
  } else {
    view.body.append(steerBubble(view, text, "undelivered"));
  }
}
