// What Loki's dialogs share (tasks-panel.js, preset-editor.js, projects.js, memory-panel.js):
// a dialog's open and close buttons, its status line, its error box (the server's message
// shown while the dialog stays open), a row's button, a list's "nothing yet" row, and ask():
// a question or a name asked in a modal of Loki's own (conversations.js, composer.js and
// projects.js).
// Loaded before the panels; window.LokiDialog.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);

  // The modal dialog `dialogId`, closed by the button `closeId` (and Escape, natively).
  // Returns {open(), close()}.
  function bind(dialogId, closeId) {
    const dlg = $(dialogId);
    $(closeId).onclick = () => dlg.close();
    return { open: () => dlg.showModal(), close: () => dlg.close() };
  }

  // The status line `id`: text ("" clears it), in the error colour when isError.
  function status(id, text, isError) {
    const el = $(id);
    el.textContent = text || "";
    el.className = isError ? "hint error" : "hint";
  }

  // The error box `id`: shows text (an Error's message too) scrolled into view; hidden when
  // there is none.
  function error(id, text) {
    const el = $(id);
    const msg = text && typeof text === "object" ? text.message || String(text) : text || "";
    el.textContent = msg;
    el.hidden = !msg;
    if (msg) el.scrollIntoView({ block: "nearest" });
  }

  // A list row's button (type "button": never submits a form).
  function button(text, onclick, cls) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    if (cls) b.className = cls;
    b.onclick = onclick;
    return b;
  }

  // Appends to the list `ul` the row saying it is empty (class `cls`, "hint" by default).
  function emptyRow(ul, text, cls) {
    const li = document.createElement("li");
    li.className = cls || "hint";
    li.textContent = text;
    ul.appendChild(li);
  }

  // Asks in Loki's own modal (#ask-dialog), never the browser's prompt()/confirm():
  // {title, text, label (with value: a text field), ok, danger}. Resolves with the typed text
  // (a field), true (no field), or null when cancelled (Cancel, Escape).
  let asking = null;
  function ask(opts) {
    const dlg = $("ask-dialog");
    if (asking) asking(null);
    $("ask-title").textContent = opts.title || "";
    $("ask-text").textContent = opts.text || "";
    $("ask-text").hidden = !opts.text;
    const field = opts.label !== undefined;
    $("ask-field").hidden = !field;
    $("ask-label").textContent = opts.label || "";
    $("ask-input").value = field ? opts.value || "" : "";
    $("ask-input").required = field;
    const ok = $("ask-ok");
    ok.textContent = opts.ok || "OK";
    ok.className = opts.danger ? "danger" : "primary";
    return new Promise((resolve) => {
      const done = (v) => { asking = null; dlg.onclose = null; if (dlg.open) dlg.close(); resolve(v); };
      asking = done;
      $("ask-form").onsubmit = (ev) => { ev.preventDefault(); done(field ? $("ask-input").value : true); };
      $("ask-cancel").onclick = () => done(null);
      dlg.onclose = () => done(null);
      dlg.showModal();
      (field ? $("ask-input") : ok).focus();
      if (field) $("ask-input").select();
    });
  }

  window.LokiDialog = { bind, status, error, button, emptyRow, ask };
})();
