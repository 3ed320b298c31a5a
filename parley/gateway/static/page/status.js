// A turn's statuses as the page tells them apart: which have ended, which can be
// resumed, and the words its badge shows for each.

export const TERMINAL = new Set([
  "finished", "succeeded", "check_failed", "budget_exceeded", "cancelled", "failed",
]);
export const RESUMABLE = new Set(["cancelled", "failed"]);
export const STATUS_LABEL = {
  queued: "queued",
  running: "running",
  waiting: "waiting for approval",
  throttled: "waiting for capacity",
  finished: "finished",
  succeeded: "succeeded",
  check_failed: "check failed",
  budget_exceeded: "budget exceeded",
  cancelled: "cancelled",
  failed: "failed",
};
