// Server-sent events parsed from text as it arrives (the page reads its streams with fetch).

/** Server-sent events parsed from text chunks as they arrive: frames may be split
 *  anywhere, lines end in LF, CRLF or CR, and comment lines (": keep-alive") are not
 *  events.  Follows the WHATWG event-stream interpretation. */
export class SSEParser {
  constructor(onEvent, onComment = () => {}) {
    this.onEvent = onEvent;
    this.onComment = onComment;
    this.buffer = "";
    this.data = [];
    this.type = "";
    this.lastId = "";
  }

  push(chunk) {
    this.buffer += chunk;
    const eol = /\r\n|\r|\n/g;
    let start = 0;
    let match;
    while ((match = eol.exec(this.buffer)) !== null) {
      // A CR at the very end may be the first half of a CRLF split across chunks.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      this.line(this.buffer.slice(start, match.index));
      start = match.index + match[0].length;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === "") {
      this.dispatch();
      return;
    }
    if (line.startsWith(":")) {
      this.onComment(line.slice(1).trim());
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.type = value;
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
  }

  dispatch() {
    const data = this.data;
    const type = this.type || "message";
    this.data = [];
    this.type = "";
    if (data.length === 0) return;
    this.onEvent({ id: this.lastId, type, data: data.join("\n") });
  }
}
