// Markdown for the replies: markdown-it (CommonMark + GitHub tables and strikethrough), raw
// HTML in the text shown as text (html: false), code blocks highlighted by highlight.js, and
// the result passed through DOMPurify before it reaches the page. The three are vendored
// files (static/vendor/, see its README.md); no build step.
//
//   LokiMarkdown.render(src) -> sanitised HTML string
//   LokiMarkdown.escape(s)   -> s with & < > " ' escaped
"use strict";

(function () {
  function esc(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
            .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  // Highlighted only when the fence names a language highlight.js knows; else markdown-it
  // escapes the code itself (an empty string from here).
  function highlight(code, lang) {
    if (!window.hljs || !lang || !window.hljs.getLanguage(lang)) return "";
    try { return window.hljs.highlight(code, { language: lang, ignoreIllegals: true }).value; }
    catch (e) { return ""; }
  }

  const parser = window.markdownit({
    html: false,        // "<b>" typed by the model shows as text
    linkify: true,
    breaks: true,       // a single newline is a line break, as chat replies are written
    typographer: false,
    highlight: highlight,
  });

  // Links open in a new tab without access to this page; anything DOMPurify keeps that is not
  // a plain link (a javascript: URL never gets past markdown-it nor DOMPurify) stays inert.
  window.DOMPurify.addHook("afterSanitizeAttributes", function (node) {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });

  const PURIFY = {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe"],
    ADD_ATTR: ["target"],
  };

  function render(src) {
    return window.DOMPurify.sanitize(parser.render(src), PURIFY);
  }

  window.LokiMarkdown = { render: render, escape: esc };
})();
