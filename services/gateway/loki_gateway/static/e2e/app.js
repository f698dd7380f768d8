// The e2e PWA's page (issue 45): pairing by pasting the code, then the chat: conversations,
// send, stop, the streamed answer, resume after a cut (from the last seq received), and the
// errors shown as they are. A broken protocol (E2EError) stops the stream for good.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const S = window.E2ESeal;
  const { Client, E2ERefused } = window.E2EClient;
  const API_BASE = new URL("..", location.href).pathname.replace(/\/$/, ""); // the page is <base>/e2e/
  const state = { client: null, conversation: null, last: 0, abort: null, current: null, stopped: false };

  const status = (text) => { $("status").textContent = text || ""; };
  function showError(e) {
    const msg = e ? (e.message || String(e)) : "";
    $("error").textContent = msg;
    $("error").hidden = !msg;
  }

  if ("serviceWorker" in navigator) {
    navigator.serviceWorker.register("sw.js").catch((e) => status("offline copy not installed: " + e.message));
  }

  async function start() {
    const saved = JSON.parse(localStorage.getItem("lokiE2E") || "null");
    $("pair-view").hidden = !!saved;
    $("chat-view").hidden = !saved;
    $("forget-btn").hidden = !saved;
    if (!saved) { $("pair-code").focus(); return; }
    const key = await S.importKey(S.b64d(saved.key));
    state.client = new Client(saved.device, key, API_BASE);
    await loadConversations(localStorage.getItem("lokiE2E.conversation"));
  }

  $("pair-form").onsubmit = async (ev) => {
    ev.preventDefault();
    showError("");
    try {
      const code = S.readCode($("pair-code").value);
      localStorage.setItem("lokiE2E", JSON.stringify({ device: code.device, key: S.b64e(code.key), base: code.base }));
      $("pair-code").value = "";
      await start();
    } catch (e) { showError(e); }
  };

  $("forget-btn").onclick = () => {
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
    else if (e instanceof E2ERefused && e.status === 401) { state.stopped = true; status("this device is not paired any more: unpair and pair it again"); }
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
    try { await state.client.request("control", { action: "stop", conversation: state.conversation }); }
    catch (e) { fail(e); }
  };

  start().catch(fail);
})();
