// Drive parley's POST /v1/chat and GET /v1/chat/{id}/stream with the stock `ai` package:
// DefaultChatTransport (what useChat uses) and readUIMessageStream (how it builds the
// assistant message from the chunks).
//   scenario: {url, token, chatId, steps: [...]}, each step one of
//     {send: PROMPT}                      send a user message; read the reply to its end
//     {send: PROMPT, dropAfter: CHUNK}    ...but drop the connection once a chunk of type
//                                         CHUNK arrived (the turn runs on)
//     {reconnect: true, ask?: NAME}       reconnectToStream(); read it to its end (asking
//                                         the test to act once the stream is open)
//     {regenerate: true}                  regenerate the last assistant message
//     {answer: {approved, reason?}}       answer every approval the last message asks for
//                                         (as addToolApprovalResponse does) and read the
//                                         message on
//     {sendRaw: BODY}                     send a body as is (bad input)
// and any step may first ask the test to look (askBefore: NAME, with `rendezvous`).
// The answer lists, per step, the chunks read, the final message, or the error.
import { randomUUID } from "node:crypto";
import {
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from "ai";
import { answer, ask, errorOf, scenario } from "./common.mjs";

const transport = new DefaultChatTransport({
  api: `${scenario.url}/v1/chat`,
  headers: { Authorization: `Bearer ${scenario.token}` },
});
const messages = [];

// Read a chunk stream through readUIMessageStream, keeping the chunks it saw; stop
// reading (and drop the connection) after a chunk of type `dropAfter`.
async function read(stream, { dropAfter, abort, onOpen, message: continued } = {}) {
  const chunks = [];
  let dropped = false;
  const [forMessage, forChunks] = stream.tee();
  const chunkReader = (async () => {
    const reader = forChunks.getReader();
    for (;;) {
      let next;
      try {
        next = await reader.read();
      } catch {
        break; // dropped on purpose
      }
      if (next.done) break;
      chunks.push(next.value);
      if (chunks.length === 1 && onOpen) await onOpen();
      if (dropAfter && next.value.type === dropAfter) {
        dropped = true;
        abort.abort();
        break;
      }
    }
  })();
  let message = null;
  let error = null;
  try {
    for await (const snapshot of readUIMessageStream({
      message: continued,
      stream: forMessage,
      onError: (e) => {
        error = errorOf(e);
      },
    })) {
      message = snapshot;
    }
  } catch (caught) {
    if (!dropped) error = errorOf(caught);
  }
  await chunkReader;
  return { chunks, message, error, dropped };
}

const results = [];
for (const step of scenario.steps) {
  try {
    if (step.askBefore) await ask(step.askBefore); // the test looks at the turn first
    if (step.send != null) {
      messages.push({ id: randomUUID(), role: "user", parts: [{ type: "text", text: step.send }] });
      const abort = new AbortController();
      const stream = await transport.sendMessages({
        chatId: scenario.chatId,
        messages,
        trigger: "submit-message",
        messageId: undefined,
        abortSignal: abort.signal,
      });
      const outcome = await read(stream, { dropAfter: step.dropAfter, abort });
      if (outcome.message) messages.push(outcome.message);
      results.push(outcome);
    } else if (step.reconnect) {
      const stream = await transport.reconnectToStream({ chatId: scenario.chatId });
      if (stream === null) {
        results.push({ noContent: true });
        continue;
      }
      const onOpen = step.ask ? () => ask(step.ask) : undefined;
      results.push(await read(stream, { onOpen }));
    } else if (step.answer) {
      const asked = messages.pop();
      const answered = {
        ...asked,
        parts: asked.parts.map((part) =>
          part.state === "approval-requested"
            ? { ...part, state: "approval-responded", approval: { ...part.approval, ...step.answer } }
            : part,
        ),
      };
      messages.push(answered);
      const complete = lastAssistantMessageIsCompleteWithApprovalResponses({ messages });
      const stream = await transport.sendMessages({
        chatId: scenario.chatId,
        messages,
        trigger: "submit-message",
        messageId: answered.id,
        abortSignal: undefined,
      });
      const outcome = await read(stream, { message: answered });
      messages[messages.length - 1] = outcome.message ?? answered;
      results.push({ ...outcome, complete });
    } else if (step.regenerate) {
      const replaced = messages.pop();
      const stream = await transport.sendMessages({
        chatId: scenario.chatId,
        messages,
        trigger: "regenerate-message",
        messageId: replaced.id,
        abortSignal: undefined,
      });
      const outcome = await read(stream);
      if (outcome.message) messages.push(outcome.message);
      results.push(outcome);
    } else if (step.sendRaw != null) {
      const stream = await transport.sendMessages({
        chatId: scenario.chatId,
        ...step.sendRaw,
        abortSignal: undefined,
      });
      results.push(await read(stream));
    }
  } catch (caught) {
    results.push({ error: errorOf(caught) });
  }
}
answer({ results });
