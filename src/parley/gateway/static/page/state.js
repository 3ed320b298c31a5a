// The page's state: the token, the sessions listed, the session shown (its history and
// tree), the turns on screen and the streams that follow them; and what follows from it,
// the turn the message box steers.

export const state = {
  token: null,
  locked: false,
  sessions: [],
  sessionsDone: false,
  sessionId: null,
  session: null,
  history: [],
  compactions: [], // the session's compactions (docs/compaction.md), dropped ones too
  tree: [],
  views: new Map(), // turn id → TurnView
  streams: new Map(), // turn id → TurnStream
  generation: 0, // bumped on every session switch: late answers for another are dropped
};

/** The turn the message box steers: the newest followed turn that has not ended. */
export function activeView() {
  let found = null;
  for (const [id, stream] of state.streams) {
    const view = state.views.get(id);
    if (view && view.running && !stream.done) found = view;
  }
  return found;
}
