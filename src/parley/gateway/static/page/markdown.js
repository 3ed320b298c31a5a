// A reply's Markdown as the chat UIs show it: parsed by marked (GitHub's flavour), then
// sanitized by DOMPurify before any of it reaches the page.  Raw HTML in a reply is shown
// as the text it is, never parsed; links open in a new tab that cannot reach back to
// this one (the page's token lives here).  Both libraries are vendored (vendor/README.md).

import { Marked } from "../vendor/marked.esm.js";
import "../vendor/purify.min.js"; // a UMD build: it sets globalThis.DOMPurify

const purify = globalThis.DOMPurify;

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
}

const marked = new Marked({
  gfm: true,
  async: false,
  renderer: {
    // "<b>hi</b>" in a reply is those characters: a model (or whoever it quotes) never
    // writes markup into the page.
    html({ text, block }) {
      return block ? `<p>${escapeHtml(text.trim())}</p>` : escapeHtml(text);
    },
    // An image would load from wherever its address points (the policy blocks that, and
    // an image's request tells its server who reads the reply): a link to it instead.
    image({ href, text }) {
      return `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`;
    },
  },
});

// What marked makes of Markdown, and nothing else: no forms, no media, no SVG or MathML.
const ALLOWED_TAGS = [
  "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
  "input", "li", "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
];
const ALLOWED_ATTR = ["href", "title", "class", "align", "start", "type", "checked", "disabled"];
const CODE_CLASS = /^language-[\w+#.-]+$/;

purify.addHook("uponSanitizeAttribute", (node, data) => {
  // A class only names a code block's language: a reply cannot dress itself up as one
  // of the page's own elements (a banner, a button).
  if (data.attrName === "class" && !(node.tagName === "CODE" && CODE_CLASS.test(data.attrValue))) {
    data.keepAttr = false;
  }
});
purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
  if (node.tagName === "INPUT") {
    // A task list's box: shown, never a control.
    if (node.getAttribute("type") !== "checkbox") node.remove();
    else node.setAttribute("disabled", "");
  }
});

/** Markdown text as a sanitized DOM fragment (nothing in it runs). */
export function markdownFragment(text) {
  const html = marked.parse(String(text ?? "")).trim();
  return purify.sanitize(html, {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
    RETURN_DOM_FRAGMENT: true,
  });
}

/** Show ``text`` in ``el`` as rendered Markdown, replacing what it showed. */
export function renderMarkdown(el, text) {
  el.replaceChildren(markdownFragment(text));
}
