// One turn on screen: the prompt, the agent's side (its reply, or the timeline of its
// events once followed), and the foot under them.  What each event shows lives in the
// modules by what it shows; this view holds the turn's parts and routes events to them.

import { h } from "../dom.js";
import { renderMarkdown } from "../markdown.js";
import { contentChanged } from "../scroll.js";
import { TERMINAL } from "../status.js";
import { onApprovalRequested, showApproval } from "./approvals.js";
import { renderFoot } from "./foot.js";
import { onEnd, renderSummary } from "./reply.js";
import { onAgentEnded, onAgentStarted, onChildEvent } from "./agents.js";
import { addPendingSteer, onSteer } from "./steers.js";
import {
  onCheck, onQueued, onStarted, onStep, onStepRestarted, onThrottled, onToken, onWaiting,
} from "./steps.js";
import { onRefusal, onToolCall, onToolResult } from "./tools.js";

// Elements that hold nothing: the streaming caret never goes into one.
const VOID_TAGS = new Set(["BR", "HR", "INPUT"]);

// What each kind of event shows; a kind this page does not know yet shows nothing.
const SHOW = {
  queued: onQueued,
  started: onStarted,
  token: onToken,
  tool_call: onToolCall,
  tool_result: onToolResult,
  refusal: onRefusal,
  steer: onSteer,
  check: onCheck,
  step: onStep,
  step_restarted: onStepRestarted,
  approval_requested: onApprovalRequested,
  throttled: onThrottled,
  agent_started: onAgentStarted,
  agent_ended: onAgentEnded,
  waiting: onWaiting,
  // The turn compacted its session first: the conversation shows the divider.
  compacted: (view) => { if (view.running) view.actions.compacted(); },
  end: onEnd,
};

/** A turn on screen.  `actions` are what its controls and its status changes ask of the
 *  page (app.js wires them: a view imports no controller): startTurn(text),
 *  resumeTurn(view), showSteps(view), branchFrom(turnId), answerApproval(turnId,
 *  approvalId, decision) (whether it was taken), turnStatusChanged(view) and compacted()
 *  (a compaction was made: read the session again). */
export class TurnView {
  constructor(turn, actions) {
    this.turn = { ...turn };
    this.actions = actions;
    this.live = false; // its events are being followed
    this.detailed = false; // its body is the event timeline, not just the reply
    this.lastSeq = 0;
    this.cursor = null; // resumes its tree stream after the last event shown
    this.blocks = new Map(); // step index → {el, bubble, textEl, tools, committed, source}
    this.unrendered = new Set(); // blocks whose source changed since they were rendered
    this.calls = new Map(); // call_id → tool card
    this.agents = new Map(); // a child turn's id → its card (agents.js), any depth
    this.approvals = new Map(); // approval_id → card
    this.pendingSteers = [];
    this.current = null;

    this.badge = h("span", { class: "badge" });
    this.note = h("span", { class: "turn-note", "aria-live": "polite" });
    this.when = h("time", { class: "turn-time" });
    this.controls = h("div", { class: "turn-actions" });
    this.body = h("div", { class: "agent-body" });
    this.caret = h("span", { class: "caret", "aria-hidden": "true" });
    this.typing = h("div", { class: "typing", "aria-label": "the agent is working" },
      h("span"), h("span"), h("span"));
    this.promptEl = h("div", { class: "bubble user" });
    this.el = h("li", { class: "turn", dataset: { turnId: turn.turn_id } },
      h("div", { class: "row user-row" }, this.promptEl),
      h("div", { class: "row agent-row" },
        h("div", { class: "avatar", "aria-hidden": "true" }),
        this.body),
      h("div", { class: "turn-foot" }, this.badge, this.note, this.when, this.controls),
    );
    this.promptEl.textContent = turn.prompt ?? "";
    this.render();
  }

  get status() {
    return this.turn.status;
  }

  get running() {
    return !TERMINAL.has(this.turn.status);
  }

  /** Whether the last event shown is the turn's `end`. */
  get ended() {
    return this.lastKind === "end";
  }

  /** New facts about the turn from the API (ignored while its stream is the truth). */
  update(turn) {
    if (this.live && this.running) return;
    if (this.ended && !TERMINAL.has(turn.status)) {
      // Read before the end on screen (the reads behind a refresh straddled it), or
      // resumed since, elsewhere: either way its stream tells (followActive follows it
      // on from the end), and until it does the turn is shown as it ended.
      turn = { ...turn, status: this.turn.status, reply: this.turn.reply };
    }
    const changed = turn.status !== this.turn.status || turn.reply !== this.turn.reply;
    Object.assign(this.turn, turn);
    if (changed || !this.detailed) this.render();
  }

  setStatus(status) {
    // Replaying a turn that had ended shows its steps, not the statuses it went through.
    if (this.replaying || status === this.turn.status) return;
    this.turn.status = status;
    this.renderFoot();
    this.actions.turnStatusChanged(this);
  }

  render() {
    if (!this.detailed) renderSummary(this);
    this.renderFoot();
  }

  renderFoot() {
    renderFoot(this);
  }

  setNote(text) {
    this.note.textContent = text || "";
  }

  /** Start showing the event timeline (from seq 0: whatever was shown goes). */
  beginTimeline() {
    this.detailed = true;
    this.lastSeq = 0;
    this.cursor = null;
    this.lastKind = null;
    this.blocks.clear();
    this.calls.clear();
    this.agents.clear();
    this.current = null;
    const keepApprovals = [...this.approvals.values()];
    this.approvals.clear();
    this.body.replaceChildren();
    for (const card of keepApprovals) this.approvals.set(card.dataset.approvalId, card);
    this.renderFoot();
  }

  /** A step's part of the timeline (its text, then its tool calls), made when first met. */
  block(index) {
    let block = this.blocks.get(index);
    if (!block) {
      const textEl = h("div", { class: "text" });
      const bubble = h("div", { class: "bubble agent empty" }, textEl);
      const tools = h("div", { class: "tools" });
      const el = h("div", { class: "step", dataset: { step: index } }, bubble, tools);
      block = { el, bubble, textEl, tools, committed: false, streamed: "", source: "" };
      this.blocks.set(index, block);
      this.body.append(el);
    }
    this.current = block;
    return block;
  }

  apply(event) {
    const d = event.data || {};
    if (event.path?.length) {
      onChildEvent(this, event); // a sub-agent's: its card shows it
      return;
    }
    this.lastSeq = Math.max(this.lastSeq, event.seq || 0);
    this.lastKind = event.kind;
    if (this.status === "waiting" && ["token", "tool_result", "step", "steer"].includes(event.kind)) {
      this.setStatus("running"); // answered: the turn went on
    }
    if (Object.hasOwn(SHOW, event.kind)) SHOW[event.kind](this, d);
    this.refreshLive();
  }

  /** A child turn's task (its prompt, read by the controller) on its card. */
  agentTask(turnId, task) {
    this.agents.get(turnId)?.showTask(task);
  }

  approval(a) {
    showApproval(this, a);
  }

  addPendingSteer(text) {
    addPendingSteer(this, text);
  }

  /** Show ``text`` (Markdown) as a step's text: rendered at the next frame, once for
   *  however many tokens arrived before it (a long reply replayed is not parsed once per
   *  token). */
  showText(block, text) {
    block.source = text;
    block.bubble.classList.toggle("empty", !text);
    this.unrendered.add(block);
    if (this.unrendered.size === 1) requestAnimationFrame(() => this.renderTexts());
  }

  renderTexts() {
    for (const block of this.unrendered) renderMarkdown(block.textEl, block.source);
    this.unrendered.clear();
    this.refreshLive();
    contentChanged();
  }

  divider(text, kind) {
    this.body.append(h("div", { class: `note-divider ${kind}`, role: "note" }, h("span", {}, text)));
    this.current = null;
  }

  /** The streaming caret after the text that is arriving, or the typing dots while the
   *  agent works on something else (a tool, the next model call). */
  refreshLive() {
    const running = this.live && this.running;
    this.el.classList.toggle("live", running);
    if (!running || this.status === "waiting" || this.status === "throttled") {
      this.caret.remove();
      this.typing.remove();
      return;
    }
    const streaming = this.current && !this.current.committed && this.current.streamed
      && this.current.tools.childElementCount === 0;
    if (streaming) {
      this.typing.remove();
      // At the end of the text's last line: inside its deepest last element (a
      // paragraph, a list item, a code block), not on a line of its own after it.
      this.caret.remove();
      let end = this.current.textEl;
      while (end.lastElementChild && !VOID_TAGS.has(end.lastElementChild.tagName)) end = end.lastElementChild;
      end.append(this.caret);
    } else {
      this.caret.remove();
      this.body.append(this.typing);
    }
  }
}
