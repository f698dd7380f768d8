// The memory lock in the sidebar: its state (/api/memory: off, locked, unlocked) and the one
// action that state allows — set a passphrase (off: the first unlock sets it), unlock with it
// (locked; a wrong one is refused with the server's message and the dialog stays open), or
// lock (unlocked). Uses window.LokiApi from app.js and window.LokiDialog (dialog.js).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const ACTION = { off: "Set passphrase", locked: "Unlock", unlocked: "Lock" };
  let current = null;
  let dialog = null;

  function show(state) {
    current = state;
    const pill = $("memory-state");
    pill.textContent = "memory: " + (state || "unknown");
    pill.className = "pill memory-" + (state || "unknown");
    const btn = $("memory-btn");
    btn.hidden = !ACTION[state];
    btn.textContent = ACTION[state] || "";
  }

  async function refresh() {
    try { show((await LokiApi.apiJSON("/api/memory")).state); }
    catch (e) { show(null); }
  }

  function askPassphrase() {
    $("memory-prompt").textContent = current === "off"
      ? "Choose the passphrase that will lock your memory."
      : "Your memory is locked. Passphrase:";
    $("memory-ok").textContent = current === "off" ? "Set and unlock" : "Unlock";
    $("memory-pass").value = "";
    LokiDialog.error("memory-error", "");
    dialog.open();
  }

  async function unlock(ev) {
    ev.preventDefault();
    const passphrase = $("memory-pass").value;
    if (!passphrase) return;
    $("memory-ok").disabled = true;
    try {
      show((await LokiApi.apiJSON("/api/memory/unlock", { method: "POST", json: { passphrase } })).state);
      dialog.close();
    } catch (e) {
      LokiDialog.error("memory-error", e.message);
    } finally {
      $("memory-ok").disabled = false;
    }
  }

  async function lock() {
    try { show((await LokiApi.apiJSON("/api/memory/lock", { method: "POST" })).state); }
    catch (e) { refresh(); }
  }

  function init() {
    dialog = LokiDialog.bind("memory-dialog", "memory-cancel");
    $("memory-btn").onclick = () => (current === "unlocked" ? lock() : askPassphrase());
    $("memory-form").onsubmit = unlock;
    refresh();
    setInterval(refresh, 15000);
  }

  window.LokiMemory = { refresh: refresh };
  init();
})();
