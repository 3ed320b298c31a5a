// The tenant's schedules for the sidebar (docs/time.md#schedules; schedule-list.js shows
// them).  loadSchedules reads them again only if they changed (If-None-Match), which the
// sidebar's watch (sidebar-polling.js) asks for every few seconds: a firing moves a
// schedule's next slot, and a schedule made elsewhere appears.

import { api, report } from "./api.js";
import { renderScheduleList } from "./schedule-list.js";

const schedules = { list: [], tag: null };

/** The schedules, read again if they changed, and shown.  `quiet`: a failure is left to
 *  the next look. */
export async function loadSchedules({ quiet = false } = {}) {
  let answer;
  try {
    answer = await api("GET", "/v1/schedules", undefined, { ifNoneMatch: schedules.tag });
  } catch (err) {
    if (!quiet) report(err, "Could not list the schedules");
    return;
  }
  if (answer.status === 304) return;
  schedules.tag = answer.etag;
  schedules.list = answer.data.schedules || [];
  renderScheduleList(schedules.list);
}
