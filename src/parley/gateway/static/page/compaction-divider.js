// A compaction on the page (docs/compaction.md#seen): a divider under the newest turn it
// covers, saying how the model is sent the turns above it from then on, with its text
// (the summary, or what was trimmed) folded until asked for.  The turns stay on the page:
// the store never forgets them.

import { h } from "./dom.js";

/** The divider of one compaction (`applies`: the one the next turn is sent). */
export function compactionDivider(c, applies) {
  const what = {
    summarize: "the model is sent the turns above as this summary",
    trim: "the model is sent the turns above with old tool results and arguments trimmed",
    // The provider's own item, opaque: its summary is what a person can read of it.
    native: "the provider that made it is sent its own compaction of the turns above; any other model, the turns",
  }[c.strategy] ?? "the model is sent the turns above compacted";
  return h(
    "li",
    {
      class: `compaction-divider${applies ? "" : " superseded"}`,
      dataset: { compactionId: c.id, throughTurnId: c.through_turn_id },
      role: "separator",
    },
    h(
      "details",
      {},
      h(
        "summary",
        {},
        h("span", { class: "compaction-label" }, `Compacted (${c.strategy})`),
        ` ${applies ? "" : "(superseded) "}${what} · ${c.tokens_before} → ${c.tokens_after} tokens`,
      ),
      h("pre", { class: "compaction-text" }, c.text),
    ),
  );
}
