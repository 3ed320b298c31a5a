// The page's state: the token, the sessions listed, the session shown (its history and
// tree), the turns on screen and the streams followed.

export const state = {
  token: null,
  locked: false,
  sessions: [],
  sessionsDone: false,
  sessionId: null,
  session: null,
  history: [],
  tree: [],
  views: new Map(), // turn id → TurnView
  followers: new Map(), // turn id → Follower
  generation: 0, // bumped on every session switch: late answers for another are dropped
};
