// Drive parley's POST /v1/ag-ui with the stock @ag-ui/client HttpAgent.
//   scenario: {url, token, threadId, messages?, rendezvous?,
//              runs: [{prompt?, runId?, resume?, askBefore?}]}
// Each run adds its prompt (if any) as a user message to the same agent, as an app does,
// and calls runAgent(); `resume: {status, payload?}` answers every pending interrupt so
// (buildResumeArray).  The answer lists, per run, every event the client applied, its
// new messages, its result or its error and the interrupts left pending, and the agent's
// messages at the end.
import { randomUUID } from "node:crypto";
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { answer, ask, errorOf, scenario } from "./common.mjs";

const agent = new HttpAgent({
  url: `${scenario.url}/v1/ag-ui`,
  headers: { Authorization: `Bearer ${scenario.token}` },
  threadId: scenario.threadId,
  initialMessages: scenario.messages ?? [],
});

const runs = [];
for (const run of scenario.runs) {
  if (run.askBefore) await ask(run.askBefore); // the test looks at the turn first
  if (run.prompt != null) {
    agent.addMessage({ id: randomUUID(), role: "user", content: run.prompt });
  }
  const events = [];
  const subscriber = { onEvent: ({ event }) => void events.push(event) };
  let outcome = null;
  let error = null;
  const parameters = run.runId ? { runId: run.runId } : {};
  if (run.resume) {
    const answers = Object.fromEntries(agent.pendingInterrupts.map((i) => [i.id, run.resume]));
    parameters.resume = buildResumeArray(agent.pendingInterrupts, answers);
  }
  try {
    outcome = await agent.runAgent(parameters, subscriber);
  } catch (caught) {
    error = errorOf(caught);
  }
  runs.push({
    events,
    newMessages: outcome?.newMessages ?? null,
    result: outcome?.result ?? null,
    error,
    pendingInterrupts: agent.pendingInterrupts,
  });
}
answer({ runs, messages: agent.messages });
