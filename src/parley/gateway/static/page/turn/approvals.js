// Approvals in a turn: the card of a call that waits for the user's answer, with its
// approve and deny buttons (the answer is the view's answerApproval action's to send).

import { h, icon } from "../dom.js";
import { ICON_ASK } from "../icons.js";
import { prettyArguments } from "./tools.js";

export function onApprovalRequested(view, d) {
  showApproval(view, d);
  view.setStatus("waiting"); // the turn holds no worker until every call has an answer
}

export function showApproval(view, a) {
  const id = a.approval_id;
  if (!id || view.approvals.has(id)) return;
  const status = h("span", { class: "approval-status" });
  const approve = h("button", { type: "button", class: "chip approve" }, "Approve");
  const deny = h("button", { type: "button", class: "chip deny" }, "Deny");
  const card = h("div", { class: "approval", dataset: { approvalId: id }, role: "group",
    "aria-label": `Approval for ${a.tool || "a tool call"}` },
    h("div", { class: "approval-head" },
      icon(ICON_ASK, "icon approval-icon"), " Approval needed: ",
      h("code", {}, a.tool || "tool")),
    a.arguments !== undefined
      ? h("pre", { class: "mono", text: typeof a.arguments === "string" ? prettyArguments(a.arguments) : JSON.stringify(a.arguments, null, 2) })
      : "",
    h("div", { class: "approval-actions" }, approve, deny, status));
  const decide = async (decision) => {
    approve.disabled = deny.disabled = true;
    if (await view.actions.answerApproval(view.turn.turn_id, id, decision)) {
      status.textContent = decision === "approve" ? "✓ approved" : "✗ denied";
      card.classList.add("closed", decision);
    } else {
      approve.disabled = deny.disabled = false;
    }
  };
  markAsking(view, a.tool);
  approve.addEventListener("click", () => decide("approve"));
  deny.addEventListener("click", () => decide("deny"));
  view.approvals.set(id, card);
  view.body.append(card);
}

/** The running cards of the tool asked about say they wait for the answer. */
function markAsking(view, tool) {
  for (const card of view.calls.values()) {
    if (card.stateEl.classList.contains("running") && card.querySelector(".tool-name").textContent === tool) {
      card.stateEl.className = "tool-state asking";
      card.stateEl.textContent = "awaiting approval";
    }
  }
}
