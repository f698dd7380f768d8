// Paired devices (issue 45): the "Devices" dialog against /api/e2e/devices. Pair a phone (a
// name; the QR code and the text code are shown this once, never again), list the devices
// (name, created, last seen, revoked), rename, revoke (asked first). The phone opens
// <Loki or relay>/e2e/, installs it, and pastes the code there.
// Builds its own <dialog>; uses window.LokiApi (app.js) and window.LokiDialog (dialog.js).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const D = window.LokiDialog;
  const BASE = "/api/e2e/devices";
  let dialog = null;

  function build() {
    const dlg = document.createElement("dialog");
    dlg.id = "devices-dialog";
    dlg.setAttribute("aria-labelledby", "devices-title");
    // its few styles inline (app.css is the main page's): width as the other dialogs, the
    // close button shown (icons are hidden by default there)
    dlg.style.width = "min(640px, calc(100vw - 24px))";
    dlg.style.maxHeight = "calc(100vh - 24px)";
    dlg.innerHTML = `
      <div class="presets-head"><h2 id="devices-title">Devices</h2>
        <button id="devices-close" type="button" class="icon" aria-label="Close"
          style="display: inline-block">✕</button></div>
      <p class="hint">A paired phone reaches Loki through a relay or tunnel you need not trust:
        everything it sends and receives is sealed with its own key. Open <code>/e2e/</code>
        on the phone, install it, and paste the code shown here.</p>
      <p id="devices-error" class="error" role="alert" hidden></p>
      <form id="devices-form" autocomplete="off">
        <label for="devices-name">Device name</label>
        <input id="devices-name" name="name" required maxlength="80" placeholder="My phone">
        <div class="dialog-buttons"><button type="submit" class="primary">Pair a device</button></div>
      </form>
      <section id="devices-new" hidden aria-label="New device's code">
        <p class="hint">Shown once: scan the QR code or copy the code now.</p>
        <div id="devices-qr"></div>
        <label for="devices-code">Pairing code</label>
        <textarea id="devices-code" readonly rows="3" style="width: 100%"></textarea>
      </section>
      <ul id="devices-list" aria-label="Paired devices"></ul>`;
    document.body.appendChild(dlg);
    $("devices-form").onsubmit = (ev) => { ev.preventDefault(); create(); };
    return D.bind("devices-dialog", "devices-close");
  }

  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "never");

  async function load() {
    D.error("devices-error", "");
    const ul = $("devices-list");
    try {
      const body = await window.LokiApi.apiJSON(BASE);
      ul.replaceChildren();
      if (!body.devices.length) D.emptyRow(ul, "No device paired yet.");
      for (const d of body.devices) ul.appendChild(row(d));
    } catch (e) { D.error("devices-error", e); }
  }

  function row(d) {
    const li = document.createElement("li");
    const text = document.createElement("span");
    text.textContent = `${d.name} — paired ${when(d.created)}, last seen ${when(d.last_seen)}` +
      (d.revoked ? `, revoked ${when(d.revoked)}` : "");
    li.appendChild(text);
    li.appendChild(D.button("Rename", () => rename(d)));
    if (!d.revoked) li.appendChild(D.button("Revoke", () => revoke(d), "danger"));
    return li;
  }

  async function call(path, opts) {
    try { return await window.LokiApi.apiJSON(path, opts); }
    catch (e) { D.error("devices-error", e); return null; }
  }

  async function create() {
    const name = $("devices-name").value.trim();
    const made = await call(BASE, { method: "POST", json: { name } });
    if (!made) return;
    $("devices-qr").innerHTML = made.qr_svg; // the gateway's own SVG (segno)
    $("devices-code").value = made.code;
    $("devices-new").hidden = false;
    $("devices-name").value = "";
    load();
  }

  async function rename(d) {
    const name = await D.ask({ title: "Rename device", label: "Name", value: d.name, ok: "Rename" });
    if (name && name.trim()) {
      await call(`${BASE}/${encodeURIComponent(d.id)}`, { method: "PATCH", json: { name: name.trim() } });
      load();
    }
  }

  async function revoke(d) {
    const sure = await D.ask({
      title: `Revoke ${d.name}?`, text: "It is refused at once, open streams included; pair it again to use it.",
      ok: "Revoke", danger: true,
    });
    if (sure) { await call(`${BASE}/${encodeURIComponent(d.id)}`, { method: "DELETE" }); load(); }
  }

  function open() {
    if (!dialog) dialog = build();
    $("devices-new").hidden = true; // a code is shown once: gone when the dialog reopens
    $("devices-code").value = "";
    $("devices-qr").replaceChildren();
    dialog.open();
    load();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const btn = $("devices-btn");
    if (btn) btn.onclick = open;
  });
  if (document.readyState !== "loading" && $("devices-btn")) $("devices-btn").onclick = open;
})();
