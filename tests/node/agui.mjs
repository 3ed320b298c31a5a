// Drive parley's POST /v1/ag-ui with the stock @ag-ui/client HttpAgent.
//   scenario: {url, token, threadId, messages?, runs: [{prompt?, runId?}]}
// Each run adds its prompt (if any) as a user message to the same agent, as an app does,
// and calls runAgent(); the answer lists, per run, every event the client applied, its
// new messages, its result or its error, and the agent's messages at the end.
import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";
import { answer, errorOf, scenario } from "./common.mjs";

const agent = new HttpAgent({
  url: `${scenario.url}/v1/ag-ui`,
  headers: { Authorization: `Bearer ${scenario.token}` },
  threadId: scenario.threadId,
  initialMessages: scenario.messages ?? [],
});

const runs = [];
for (const run of scenario.runs) {
  if (run.prompt != null) {
    agent.addMessage({ id: randomUUID(), role: "user", content: run.prompt });
  }
  const events = [];
  const subscriber = { onEvent: ({ event }) => void events.push(event) };
  let outcome = null;
  let error = null;
  try {
    outcome = await agent.runAgent(run.runId ? { runId: run.runId } : {}, subscriber);
  } catch (caught) {
    error = errorOf(caught);
  }
  runs.push({
    events,
    newMessages: outcome?.newMessages ?? null,
    result: outcome?.result ?? null,
    error,
  });
}
answer({ runs, messages: agent.messages });
