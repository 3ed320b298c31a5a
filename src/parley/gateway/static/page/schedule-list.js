// The tenant's schedules in the sidebar, as schedules.js read them (docs/time.md#schedules):
// each with its cron and zone, its next slot in the reader's local time, or "paused".

import { $, h } from "./dom.js";
import { fullTime, oneLine } from "./format.js";

/** The schedules of `list` (GET /v1/schedules's), oldest first; the section is hidden
 *  while there is none. */
export function renderScheduleList(list) {
  const section = $("schedules-section");
  section.hidden = list.length === 0;
  $("schedule-list").replaceChildren(...list.map((s) => {
    const next = s.next_at ? `next ${fullTime(s.next_at)}` : "paused";
    return h("li", {
      class: `schedule${s.paused ? " paused" : ""}`,
      title: `${s.id}\n${s.prompt}`,
    },
    h("span", { class: "schedule-name" }, s.name || oneLine(s.prompt, 40)),
    h("span", { class: "schedule-cron" }, `${s.cron} · ${s.timezone}`),
    h("span", { class: "schedule-next session-meta" }, next));
  }));
}
