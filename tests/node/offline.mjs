// Feed a stream that parley's projection produced (no gateway) to a stock client, through
// a fetch that answers it, and report what the client made of it.
//   scenario: {protocol: "ag-ui", events: [AG-UI event], messages: [Message]}
//           | {protocol: "ai-sdk", chunks: [chunk]}
import { HttpAgent } from "@ag-ui/client";
import { DefaultChatTransport, readUIMessageStream } from "ai";
import { answer, errorOf, scenario } from "./common.mjs";

const frames = (items) => items.map((item) => `data: ${typeof item === "string" ? item : JSON.stringify(item)}\n\n`).join("");
const respond = (body, headers) => async () =>
  new Response(body, { status: 200, headers: { "content-type": "text/event-stream", ...headers } });

if (scenario.protocol === "ag-ui") {
  const agent = new HttpAgent({
    url: "http://parley.invalid/v1/ag-ui",
    threadId: "thread",
    initialMessages: scenario.messages,
    fetch: respond(frames(scenario.events)),
  });
  let error = null;
  let outcome = null;
  try {
    outcome = await agent.runAgent({ runId: "run" });
  } catch (caught) {
    error = errorOf(caught);
  }
  answer({ messages: agent.messages, result: outcome?.result ?? null, error });
} else {
  const transport = new DefaultChatTransport({
    api: "http://parley.invalid/v1/chat",
    fetch: respond(frames([...scenario.chunks, "[DONE]"]), { "x-vercel-ai-ui-message-stream": "v1" }),
  });
  const stream = await transport.sendMessages({
    chatId: "chat",
    messages: [{ id: "u1", role: "user", parts: [{ type: "text", text: "hello" }] }],
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: undefined,
  });
  let message = null;
  const errors = [];
  try {
    for await (const snapshot of readUIMessageStream({ stream, onError: (e) => errors.push(errorOf(e)) })) {
      message = snapshot;
    }
  } catch (caught) {
    errors.push(errorOf(caught));
  }
  answer({ message, errors });
}
