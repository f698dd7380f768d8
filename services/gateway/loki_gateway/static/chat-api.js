// The chat page's way to the gateway: the API key (asked once in its dialog, sent as a
// header), JSON requests, and the frames of an SSE response read with fetch() (not
// EventSource, so the key can be sent as a header). Part of the chat page (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  function authHeaders() {
    const key = localStorage.getItem("lokiKey");
    return key ? { Authorization: "Bearer " + key } : {};
  }

  let keyPrompt = null;  // one dialog for all the requests refused at once
  function askKey() {
    if (keyPrompt) return keyPrompt;
    keyPrompt = new Promise((resolve) => {
      const dlg = $("key-dialog");
      const typed = () => $("key-input").value.trim();
      // stored at submit, before the dialog closes (its close event comes a task later)
      dlg.querySelector("form").onsubmit = () => { if (typed()) localStorage.setItem("lokiKey", typed()); };
      dlg.onclose = () => {
        const v = typed();
        if (v) localStorage.setItem("lokiKey", v);
        keyPrompt = null;
        resolve(!!v);
      };
      dlg.showModal();
    });
    return keyPrompt;
  }

  async function api(path, opts = {}, retried = false) {
    const usedKey = localStorage.getItem("lokiKey");
    const headers = Object.assign({}, opts.headers || {}, authHeaders());
    if (opts.json !== undefined) {
      headers["Content-Type"] = "application/json";
      opts = Object.assign({}, opts, { body: JSON.stringify(opts.json) });
    }
    const resp = await fetch(path, Object.assign({}, opts, { headers }));
    if (resp.status === 401) {
      // sent before a key was typed in: retry with it rather than asking again
      if (localStorage.getItem("lokiKey") !== usedKey) return api(path, opts, retried);
      if (!retried && (await askKey())) return api(path, opts, true);
    }
    return resp;
  }

  async function apiJSON(path, opts) {
    const resp = await api(path, opts);
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) {
      const msg = body && body.error ? body.error.message : resp.status + " " + resp.statusText;
      const err = new Error(msg);
      err.status = resp.status;
      err.code = body && body.error ? body.error.code : null;
      throw err;
    }
    return body;
  }

  async function firstJSON(paths) {
    for (const p of paths) {
      try {
        const r = await api(p);
        if (r.ok) return await r.json();
      } catch (e) { /* next */ }
    }
    return null;
  }

  // The frames of an SSE response read with fetch(), a batch per network read (a batch is
  // drawn at once); the reader is cancelled when the loop over it ends early.
  async function* sseFrames(resp) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += dec.decode(value, { stream: true });
        const batch = [];
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          batch.push(parseFrame(buf.slice(0, cut)));
          buf = buf.slice(cut + 2);
        }
        yield batch;
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  function parseFrame(block) {
    const f = { id: null, event: null, data: "" };
    for (const line of block.split("\n")) {
      if (!line || line[0] === ":") continue;
      const i = line.indexOf(":");
      const name = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value[0] === " ") value = value.slice(1);
      if (name === "data") f.data = f.data ? f.data + "\n" + value : value;
      else if (name === "id") f.id = value;
      else if (name === "event") f.event = value;
    }
    return f;
  }

  return { authHeaders, askKey, api, apiJSON, firstJSON, sseFrames };
});
