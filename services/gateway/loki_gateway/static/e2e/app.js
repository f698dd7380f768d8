// The e2e PWA's page (issue 45): pairing by pasting the code, then the chat: conversations,
// send, stop, the streamed answer, resume after a cut (from the last seq received), and the
// errors shown as they are. A broken protocol (E2EError) stops the stream for good.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const S = window.E2ESeal;
  const K = window.E2EKeys;
  const { Client, E2ERefused } = window.E2EClient;
  const API_BASE = new URL("..", location.href).pathname.replace(/\/$/, ""); // the page is <base>/e2e/
  const state = { client: null, conversation: null, last: 0, abort: null, current: null, stopped: false };

  const status = (text) => { $("status").textContent = text || ""; };
  function showError(e) {
    const msg = e ? (e.message || String(e)) : "";
    $("error").textContent = msg;
    $("error").hidden = !msg;
  }

  const UPDATED = "This app's code changed through the network: a new version of Loki, or the " +
    "relay replacing it. Nothing more is sent from this page. If you updated Loki, close every " +
    "tab of this app and open it again; if not, revoke this device on your computer and " +
    "install /e2e/ again from your home network.";

  // A new service worker found while a copy is installed (an update check answered with a
  // different sw.js): stop, and say so, before the new code can run (docs/security.md).
  function stopForUpdate() {
    state.stopped = true;
    if (state.abort) state.abort.abort();
    showError(UPDATED);
    status("stopped: the app's code changed");
  }

  if ("serviceWorker" in navigator) {
    let controlled = !!navigator.serviceWorker.controller; // the first install is no update
    navigator.serviceWorker.register("sw.js").then((reg) => {
      if (reg.active && (reg.waiting || reg.installing)) stopForUpdate();
      reg.addEventListener("updatefound", () => { if (reg.active) stopForUpdate(); });
    }).catch((e) => status("offline copy not installed: " + e.message));
    navigator.serviceWorker.addEventListener("controllerchange", () => {
      if (controlled) stopForUpdate();
      controlled = true;
    });
  }

  async function start() {
    const saved = JSON.parse(localStorage.getItem("lokiE2E") || "null");
    let key = saved ? await K.load() : null;
    if (saved && saved.key) { // an older copy kept the raw key in localStorage: move it
      key = await K.save(S.b64d(saved.key));
      localStorage.setItem("lokiE2E", JSON.stringify({ device: saved.device, base: saved.base }));
    }
    const paired = !!(saved && key);
    $("pair-view").hidden = paired;
    $("chat-view").hidden = !paired;
    $("forget-btn").hidden = !paired;
    if (!paired) { $("pair-code").focus(); return; }
    state.client = new Client(saved.device, key, API_BASE);
    await loadConversations(localStorage.getItem("lokiE2E.conversation"));
  }

  $("pair-form").onsubmit = async (ev) => {
    ev.preventDefault();
    showError("");
    try {
      const code = S.readCode($("pair-code").value);
      await K.save(code.key); // non-extractable, in IndexedDB; never in localStorage
      localStorage.setItem("lokiE2E", JSON.stringify({ device: code.device, base: code.base }));
      $("pair-code").value = "";
      await start();
    } catch (e) { showError(e); }
  };

  $("forget-btn").onclick = async () => {
    await K.forget().catch(() => {});
    localStorage.removeItem("lokiE2E");
    localStorage.removeItem("lokiE2E.conversation");
    if (state.abort) state.abort.abort();
    location.reload();
  };

  async function loadConversations(selected) {
    try {
      const body = await state.client.request("state", {});
      const sel = $("conv-select");
      sel.replaceChildren(new Option("New conversation", ""));
      for (const c of body.conversations) sel.appendChild(new Option(c.title || c.id, c.id));
      sel.value = selected && body.conversations.some((c) => c.id === selected) ? selected : "";
      openConversation(sel.value || null);
    } catch (e) { fail(e); }
  }

  $("conv-select").onchange = () => openConversation($("conv-select").value || null);

  function openConversation(id) {
    if (state.abort) state.abort.abort();
    state.conversation = id;
    state.last = 0;
    state.current = null;
    $("messages").replaceChildren();
    if (id) { localStorage.setItem("lokiE2E.conversation", id); follow(); }
  }

  function bubble(cls, text) {
    const div = document.createElement("div");
    div.className = "msg " + cls;
    div.textContent = text || "";
    $("messages").appendChild(div);
    div.scrollIntoView({ block: "end" });
    return div;
  }

  function render(ev) {
    if (ev.name === "reconnect" || ev.name === "history") return;
    const choice = (ev.data.choices || [{}])[0] || {};
    const delta = choice.delta || {};
    const loki = ev.data.loki || {};
    if (delta.role === "user") { bubble("user", delta.content); return; }
    if (delta.role === "tool") { bubble("tool", `${delta.name || "tool"}: ${delta.content || ""}`); return; }
    if (loki.event === "turn_start") { state.current = bubble("assistant", ""); setBusy(true); }
    if (delta.content) {
      if (!state.current) state.current = bubble("assistant", "");
      state.current.textContent += delta.content;
    }
    if (choice.finish_reason) {
      if (loki.error || loki.message) bubble("tool", `(${loki.error || loki.message})`);
      state.current = null;
      setBusy(false);
    }
  }

  function setBusy(busy) { $("stop-btn").hidden = !busy; }

  function fail(e) {
    showError(e);
    if (e instanceof S.E2EError) { state.stopped = true; status("stopped: the connection is not trustworthy"); }
    else if (e instanceof E2ERefused && e.status === 401) {
      state.stopped = true;
      status("refused as not paired (an unsealed answer: the relay could have made it up): " +
        "check the Devices list on your computer, and pair again if this device is revoked");
    }
  }

  // Streams the open conversation from state.last, again after each cut, until another one is
  // opened or the protocol breaks.
  async function follow() {
    const id = state.conversation;
    const abort = new AbortController();
    state.abort = abort;
    while (!abort.signal.aborted && !state.stopped && state.conversation === id) {
      try {
        status("");
        state.last = await state.client.events(id, state.last, (ev) => { state.last = ev.seq; render(ev); }, abort.signal);
      } catch (e) {
        if (abort.signal.aborted) return;
        if (e instanceof S.E2EError || e instanceof E2ERefused) { fail(e); return; }
        status("connection lost: reconnecting…");
      }
      await new Promise((r) => setTimeout(r, 1500));
    }
  }

  $("composer").onsubmit = async (ev) => {
    ev.preventDefault();
    const text = $("composer-input").value;
    if (!text.trim() || state.stopped) return;
    showError("");
    try {
      const body = { content: text };
      if (state.conversation) body.conversation = state.conversation;
      const sent = await state.client.request("send", body);
      $("composer-input").value = "";
      if (sent.conversation !== state.conversation) {
        const opt = new Option(text.split("\n")[0].slice(0, 60), sent.conversation);
        $("conv-select").appendChild(opt);
        $("conv-select").value = sent.conversation;
        openConversation(sent.conversation);
      }
      if (sent.queued) status("queued behind the running turn");
    } catch (e) { fail(e); }
  };

  $("stop-btn").onclick = async () => {
    if (state.stopped) return;
    try { await state.client.request("control", { action: "stop", conversation: state.conversation }); }
    catch (e) { fail(e); }
  };

  start().catch(fail);
})();
