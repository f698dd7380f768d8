// Attachments in the composer: the attach button, drag and drop onto the chat, pasting an
// image. Each file is uploaded at once (POST /api/chat/upload); the tray shows what the next
// message carries, and a refusal (413 too large, 415 type not accepted, an image while the
// engine has no vision: at attach time, from the engine info the page holds; on send as well)
// is said inline above the composer, never silently dropped.
// Thumbnails of a message's images are read through the API (the key travels with them);
// an image the store no longer has shows a marker instead. A text file the gateway inlined in
// the message is shown as a chip with its name, its text folded under it.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const items = [];  // {id, name, kind, url?, el}

  function showError(text) {
    const el = $("attach-error");
    el.textContent = text || "";
    el.hidden = !text;
  }

  function errorText(name, status, body) {
    const msg = body && body.error ? body.error.message : status ? String(status) : "network error";
    if (status === 413) return name + " is too large: " + msg;
    if (status === 415) return name + " cannot be attached (type not accepted): " + msg;
    return name + " not attached: " + msg;
  }

  function renderTray() {
    const tray = $("attach-tray");
    tray.hidden = items.length === 0;
  }

  function chip(item) {
    const el = document.createElement("span");
    el.className = "attach-chip " + item.kind;
    el.dataset.id = item.id;
    if (item.url) {
      const img = document.createElement("img");
      img.src = item.url; img.alt = item.name;
      el.appendChild(img);
    }
    const name = document.createElement("span");
    name.className = "name"; name.textContent = item.name;
    const rm = document.createElement("button");
    rm.type = "button"; rm.className = "icon remove"; rm.textContent = "✕";
    rm.setAttribute("aria-label", "Remove " + item.name);
    rm.onclick = () => remove(item.id);
    el.append(name, rm);
    return el;
  }

  function remove(id) {
    const at = items.findIndex((i) => i.id === id);
    if (at < 0) return;
    const [item] = items.splice(at, 1);
    item.el.remove();
    if (item.url) URL.revokeObjectURL(item.url);
    renderTray();
  }

  // The engine as last pushed (engine-status.js): false when it is known to have no vision.
  function canSee() {
    const info = window.LokiApi && window.LokiApi.engine ? window.LokiApi.engine() : null;
    return !(info && info.vision === false);
  }
  const noVision = (name) => name + " not attached: the model in use cannot see images. Switch to a preset with vision to send it.";

  async function upload(file) {
    const name = file.name || "pasted image";
    // an image the model could not see is refused here, not at Send
    if (/^image\//.test(file.type || "") && !canSee()) { showError(noVision(name)); return null; }
    const fd = new FormData();
    fd.append("file", file, name);
    let resp, body = null;
    try {
      resp = await window.LokiApi.api("/api/chat/upload", { method: "POST", body: fd });
      try { body = await resp.json(); } catch (e) { body = null; }
    } catch (e) { showError(errorText(name, 0, null)); return null; }
    if (!resp.ok) { showError(errorText(name, resp.status, body)); return null; }
    if (body.kind === "image" && !canSee()) { showError(noVision(name)); return null; }
    showError("");
    const item = { id: body.id, name: body.name, kind: body.kind };
    if (body.kind === "image") item.url = URL.createObjectURL(file);
    item.el = chip(item);
    $("attach-tray").appendChild(item.el);
    items.push(item);
    renderTray();
    return item;
  }

  async function uploadAll(files) {
    for (const f of Array.from(files || [])) await upload(f);
  }

  // The images of a message: one thumbnail each, read with the key; gone: a marker.
  function thumbs(parent, images) {
    if (!images || !images.length) return;
    const row = document.createElement("div");
    row.className = "thumbs";
    for (const im of images) {
      const fig = document.createElement("figure");
      fig.className = "thumb";
      fig.title = im.name + " (seen by the model in this turn only)";
      row.appendChild(fig);
      const conv = window.LokiApi.conversation ? window.LokiApi.conversation() : null;
      const path = "/api/chat/attachment/" + encodeURIComponent(im.id) +
        (conv ? "?conversation=" + encodeURIComponent(conv) : "");
      window.LokiApi.api(path).then(async (r) => {
        if (!r.ok) throw new Error(String(r.status));
        const img = document.createElement("img");
        img.alt = im.name;
        img.src = URL.createObjectURL(await r.blob());
        fig.appendChild(img);
      }).catch(() => {
        fig.classList.add("gone");
        fig.textContent = "[image " + im.name + ": not kept]";
      });
    }
    parent.appendChild(row);
  }

  // A user message's inlined text files, as the gateway writes them (routes/attachments.py
  // `fenced`: "Attached file `NAME`:" then the text between two fences longer than any run of
  // backticks in it, each block after the message and a blank line) -> {text, files: [{name,
  // text}]}: the message without its blocks. A text without such blocks comes back whole.
  const HEAD = "Attached file `";
  const BLOCK = /Attached file `([^\n]*)`:\n(`{3,})\n([\s\S]*?)\n\2(?:\n\n|$)/y;

  function blocksFrom(text, pos) {
    const files = [];
    while (pos < text.length) {
      BLOCK.lastIndex = pos;
      const m = BLOCK.exec(text);
      if (!m) return null;
      files.push({ name: m[1], text: m[3] });
      pos = BLOCK.lastIndex;
    }
    return files.length ? files : null;
  }

  function splitInlined(text) {
    const starts = text.startsWith(HEAD) ? [0] : [];
    for (let i = text.indexOf("\n\n" + HEAD); i >= 0; i = text.indexOf("\n\n" + HEAD, i + 1)) {
      starts.push(i + 2);
    }
    for (const start of starts) {
      const files = blocksFrom(text, start);
      if (files) return { text: text.slice(0, Math.max(0, start - 2)), files: files };
    }
    return { text: text, files: [] };
  }

  // The inlined files of a message: one folded block each, its chip (name, lines) to open it.
  function fileBlocks(parent, files) {
    for (const f of files || []) {
      const box = document.createElement("details");
      box.className = "attached-file";
      const head = document.createElement("summary");
      head.className = "file-chip";
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = f.name;
      const lines = f.text ? f.text.replace(/\n$/, "").split("\n").length : 0;
      const size = document.createElement("span");
      size.className = "size";
      size.textContent = lines + (lines === 1 ? " line" : " lines");
      head.append(name, size);
      const body = document.createElement("pre");
      body.textContent = f.text;
      box.append(head, body);
      parent.appendChild(box);
    }
  }

  function init() {
    $("attach-btn").onclick = () => $("attach-input").click();
    $("attach-input").onchange = async (ev) => { await uploadAll(ev.target.files); ev.target.value = ""; };
    const zone = document.querySelector("main");
    zone.addEventListener("dragover", (ev) => {
      if (!ev.dataTransfer || !Array.from(ev.dataTransfer.types || []).includes("Files")) return;
      ev.preventDefault();
      zone.classList.add("dropping");
    });
    zone.addEventListener("dragleave", (ev) => { if (ev.target === zone) zone.classList.remove("dropping"); });
    zone.addEventListener("drop", (ev) => {
      zone.classList.remove("dropping");
      if (!ev.dataTransfer || !ev.dataTransfer.files.length) return;
      ev.preventDefault();
      uploadAll(ev.dataTransfer.files);
    });
    $("input").addEventListener("paste", (ev) => {
      const files = Array.from((ev.clipboardData && ev.clipboardData.files) || []);
      if (!files.length) return;  // plain text pastes as usual
      ev.preventDefault();
      uploadAll(files);
    });
  }

  window.LokiAttach = {
    ids: () => items.map((i) => i.id),
    count: () => items.length,
    clear: () => { for (const i of items.slice()) remove(i.id); showError(""); },
    showError: showError,
    upload: upload,
    thumbs: thumbs,
    splitInlined: splitInlined,
    fileBlocks: fileBlocks,
  };
  init();
})();
