// Sub-agents on a turn's timeline (docs/sub-agents.md#7-seen): each agent call's child
// turn as a card inside its parent's step, in the place of the call's tool card (a
// grandchild's inside its parent's card), with the agent's name and task, its status, a
// link to its session and its text streaming live.  The turn's tree stream brings the children's events,
// each with its `path` (the agent calls from this turn down to the child that sent it).

import { h } from "../dom.js";
import { oneLine } from "../format.js";
import { renderMarkdown } from "../markdown.js";
import { contentChanged } from "../scroll.js";
import { STATUS_LABEL, TERMINAL } from "../status.js";
import { toolCard } from "./tools.js";

// A child's status as its badge's colour (the tool cards' states).
const STATE_CLASS = {
  queued: "", running: "running", waiting: "asking", throttled: "asking",
  finished: "done", succeeded: "done",
  cancelled: "error", failed: "error", budget_exceeded: "error", check_failed: "error",
};

/** The card of a child turn: made when first met (its `agent_started`, or its first
 *  event), in its parent's step under the call, or in its parent child's card. */
class AgentCard {
  constructor(step) {
    this.turnId = step.turn_id;
    this.steps = new Map(); // step index → {el, text, committed}
    this.pending = false;
    this.stateEl = h("span", { class: "tool-state" });
    this.link = h("a", { class: "agent-link", title: "Open the child's own session" }, "open session ↗");
    this.link.hidden = true;
    this.taskEl = h("span", { class: "agent-task" });
    this.textsEl = h("div", { class: "agent-texts" });
    this.notesEl = h("div", { class: "agent-notes" });
    this.kids = h("div", { class: "agent-kids" });
    const agent = String(step.agent || "agent");
    this.el = h("div", {
      class: "agent-card",
      dataset: { turnId: step.turn_id, callId: step.call_id, agent },
    },
    h("div", { class: "agent-head" },
      h("span", { class: "agent-icon", "aria-hidden": "true" }, "↳"),
      h("span", { class: "agent-name", title: `agent ${agent}` }, agent.split("/").pop()),
      this.taskEl, this.stateEl, this.link),
    this.textsEl, this.notesEl, this.kids);
    this.setStatus("queued");
  }

  setStatus(status) {
    // Its parent's `agent_ended` may come before its own last events: an end stays,
    // unless the child is queued again (resumed).
    if (TERMINAL.has(this.status) && !TERMINAL.has(status) && status !== "queued") return;
    this.status = status;
    this.el.dataset.status = status;
    this.stateEl.className = `tool-state ${STATE_CLASS[status] ?? ""}`;
    this.stateEl.textContent = STATUS_LABEL[status] || status;
  }

  setSession(sessionId) {
    if (!sessionId) return;
    this.link.href = `#s=${encodeURIComponent(sessionId)}`;
    this.link.hidden = false;
  }

  setTask(args) {
    let task = "";
    try { task = JSON.parse(args)?.task ?? ""; } catch { task = ""; }
    this.showTask(task);
  }

  showTask(task) {
    if (!task || this.taskEl.textContent) return;
    this.taskEl.textContent = oneLine(task, 60);
    this.taskEl.title = task;
  }

  step(index) {
    let step = this.steps.get(index);
    if (!step) {
      step = { el: h("div", { class: "text agent-text", dataset: { step: index } }), text: "", committed: false };
      this.steps.set(index, step);
      this.textsEl.append(step.el);
    }
    return step;
  }

  setText(index, text, { committed = false } = {}) {
    const step = this.step(index);
    if (step.committed) return;
    step.text = text;
    step.committed = committed;
    this.renderSoon();
  }

  /** Rendered at the next frame, once for however many tokens came before it. */
  renderSoon() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      for (const step of this.steps.values()) {
        if (step.el.dataset.shown !== step.text) {
          renderMarkdown(step.el, step.text);
          step.el.dataset.shown = step.text;
        }
      }
      contentChanged();
    });
  }

  note(text, cls = "") {
    this.notesEl.append(h("div", { class: `agent-note ${cls}`, text }));
  }
}

/** The card of the child at the end of `path` (making it, and its parents, if need be). */
function cardFor(view, path) {
  const last = path[path.length - 1];
  let card = view.agents.get(last.turn_id);
  if (card) return card;
  card = new AgentCard(last);
  view.agents.set(last.turn_id, card);
  if (path.length > 1) {
    cardFor(view, path.slice(0, -1)).kids.append(card.el);
  } else {
    // In the step that made the call, in the place of its tool card (hidden: the card
    // says all it would, and the child's reply is the call's result).
    const steps = [...view.blocks.keys()];
    const step = steps.length ? steps[steps.length - 1] : 0;
    const call = toolCard(view, step, last.call_id, last.agent, null);
    call.classList.add("agent-call");
    call.after(card.el);
    call.onArgs = (args) => card.setTask(args);
    if (call.argsText) card.setTask(call.argsText);
  }
  return card;
}

/** This turn's own `agent_started`: its child's card, under the call. */
export function onAgentStarted(view, d) {
  const card = cardFor(view, [{ agent: d.agent, call_id: d.call_id, turn_id: d.turn_id }]);
  card.setSession(d.session_id);
  view.heldForAgents = true; // its next attempt goes on with the children's results
  // Its step is held, holding no worker, until its last child ends.
  view.turn.waiting_for = "agents";
  view.setStatus("waiting");
}

/** This turn's own `agent_ended`: its child's outcome. */
export function onAgentEnded(view, d) {
  const card = d.turn_id ? view.agents.get(d.turn_id) : null;
  card?.setStatus(d.outcome);
}

/** A descendant's event (`event.path` not empty): shown on its card. */
export function onChildEvent(view, event) {
  const card = cardFor(view, event.path);
  const d = event.data || {};
  switch (event.kind) {
    case "queued":
      card.setStatus("queued");
      break;
    case "started":
      card.setStatus("running");
      break;
    case "token": {
      const step = card.step(d.step ?? 0);
      card.setText(d.step ?? 0, step.text + (d.text ?? ""));
      if (card.status === "waiting" || card.status === "queued") card.setStatus("running");
      break;
    }
    case "step":
      card.setText(d.index ?? 0, d.text ?? "", { committed: true });
      break;
    case "tool_call":
      card.note(`⚙ ${d.name || "tool"}`, "call");
      break;
    case "refusal":
      card.note(`refused ${d.tool || "a tool call"}${d.rule ? ` by ${d.rule}` : ""}`, "refused");
      break;
    case "approval_requested":
      card.setStatus("waiting");
      break;
    case "throttled":
      card.setStatus("throttled");
      break;
    case "agent_started": {
      const grand = cardFor(view, [...event.path, { agent: d.agent, call_id: d.call_id, turn_id: d.turn_id }]);
      grand.setSession(d.session_id);
      break;
    }
    case "agent_ended":
      if (d.turn_id) view.agents.get(d.turn_id)?.setStatus(d.outcome);
      break;
    case "end": {
      card.setStatus(d.outcome);
      const shown = [...card.steps.values()].map((s) => s.text.trim());
      if (d.reply && !shown.includes(d.reply.trim())) card.setText(card.steps.size, d.reply, { committed: true });
      if (d.error) card.note(d.error, "error");
      break;
    }
    default:
      break;
  }
  contentChanged();
}
