// The sidebar kept current: a session, batch or schedule made elsewhere (the command line, another
// tab, the API) appears, and a batch's counts move as its lines end, with no reload.
//
// The page asks again every few seconds, with the ETag of what it holds
// (docs/http.md#8-polling-with-etags): a gateway answers 304 while nothing changed, keeps
// nothing for the page between its requests, and any gateway of a fleet will do.  No
// connection is held open for it: a browser has six per host over HTTP/1.1, shared by
// every tab of the page, and the turns' streams need them.  A hidden tab does not ask.

import { batchesRunning, loadBatches } from "./batches.js";
import { loadSchedules } from "./schedules.js";
import { refreshSessions } from "./sessions.js";
import { state } from "./state.js";

const RUNNING_MS = 2000; // while a batch runs: its counts move
const IDLE_MS = 5000; // otherwise: only something new may come

let timer = null;
let looking = false;

async function look() {
  if (looking) return; // the look under way sets the next
  clearTimeout(timer);
  looking = true;
  try {
    if (!state.locked && document.visibilityState === "visible") {
      await Promise.all([
        refreshSessions(), loadBatches({ quiet: true }), loadSchedules({ quiet: true }),
      ]);
    }
  } finally {
    looking = false;
  }
  if (!state.locked) timer = setTimeout(look, batchesRunning() ? RUNNING_MS : IDLE_MS);
}

/** Keep the sidebar's sessions and batches current from now on; a tab shown again looks
 *  at once. */
export function keepSidebarCurrent() {
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") look();
  });
  timer = setTimeout(look, batchesRunning() ? RUNNING_MS : IDLE_MS);
}
