// The person's MCP tool servers (issue 42): the "Tool servers" dialog against /api/mcp/servers.
// - the list: each server's name, transport, source, state (up, down, off, unknown) with its
//   error, the tools the model sees (<server>__<tool>), which header names are set (never a
//   value: the API never sends one back), a switch On, Test (connects now: the result is
//   shown in the row), and per project a switch (projects_off; the projects from
//   /api/projects, none without a memory service);
// - HTTP servers (source "api") are added and edited here: name, URL, a bearer token and
//   more headers (password fields, emptied once saved); an edit keeps the sealed headers
//   unless "Replace the headers" is ticked; delete asks in Loki's own dialog first;
// - stdio servers and every server of LOKI_HOME/mcp.json (source "file") are read-only here
//   except On and the projects: the row says they are edited in that file.
// The API's errors ({"error": {"message"}}) are shown in the dialog, which stays open.
// Uses window.LokiApi (app.js) and window.LokiDialog (dialog.js).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const D = window.LokiDialog;
  const BASE = "/api/mcp/servers";
  const form = () => $("mcp-form");
  const field = (name) => form().elements.namedItem(name);
  let dialog = null;
  let servers = [];
  let projects = []; // [{id, name}]; empty without a memory service
  let editing = null; // the server edited, {} for a new one, null when the form is closed
  const tests = new Map(); // name -> {ok, text}: the last test's result, kept across renders

  const status = (text, isError) => D.status("mcp-status", text, isError);
  const fail = (e) => D.error("mcp-error", e);
  const formFail = (e) => D.error("mcp-form-error", e);
  const path = (name) => BASE + "/" + enc(name);

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A checkbox in its label (the label takes the tap too); `key` finds it again after a render.
  function check(text, checked, key, onchange) {
    const label = el("label", "check");
    const box = el("input");
    box.type = "checkbox";
    box.checked = checked;
    box.dataset.key = key;
    box.onchange = () => onchange(box.checked);
    label.append(box, " " + text);
    return label;
  }

  // ---- the list ----------------------------------------------------------------------------
  async function load() {
    let reply;
    try { reply = await LokiApi.apiJSON(BASE); } catch (e) { fail(e); return; }
    servers = reply.servers || [];
    render();
  }

  async function loadProjects() {
    try { projects = (await LokiApi.apiJSON("/api/projects")).projects || []; }
    catch (e) { projects = []; } // no memory service: no per-project switches
  }

  function where(s) {
    if (s.transport === "http") return s.url || "";
    return [s.command || ""].concat(s.args || []).join(" ");
  }

  function secretsLine(s) {
    const parts = [];
    if (s.header_names && s.header_names.length) parts.push("headers set: " + s.header_names.join(", "));
    if (s.env_names && s.env_names.length) parts.push("environment set: " + s.env_names.join(", "));
    return parts.length ? parts.join(" · ") : s.transport === "http" ? "no header set" : "";
  }

  function toolsBox(s) {
    const box = el("div", "mcp-tools");
    const tools = s.tools || [];
    const say = tools.length
      ? "Tools the model sees (" + tools.length + ")" + (s.state === "down" ? ", answering “unavailable” while down:" : ":")
      : "No tool listed yet.";
    box.append(el("span", "hint", say));
    if (tools.length) {
      const ul = el("ul", "mcp-tool-list");
      ul.setAttribute("aria-label", "Tools of " + s.name);
      for (const t of tools) ul.append(el("li", null, t));
      box.append(ul);
    }
    return box;
  }

  function projectsBox(s) {
    const box = el("details", "mcp-projects");
    const off = new Set(s.projects_off || []);
    const on = projects.filter((p) => !off.has(p.id)).length;
    box.append(el("summary", null, "Projects: on in " + on + " of " + projects.length));
    box.dataset.key = "projects:" + s.name;
    box.open = openDetails.has(s.name);
    box.ontoggle = () => { if (box.open) openDetails.add(s.name); else openDetails.delete(s.name); };
    const ul = el("ul");
    ul.setAttribute("aria-label", "Projects where " + s.name + " is on");
    for (const p of projects) {
      const li = el("li");
      li.dataset.project = p.id;
      li.append(check(p.name, !off.has(p.id), "project:" + s.name + ":" + p.id,
                      (isOn) => setProject(s, p.id, isOn)));
      ul.append(li);
    }
    box.append(ul);
    return box;
  }
  const openDetails = new Set();

  function row(s) {
    const li = el("li", "mcp-server");
    li.dataset.name = s.name;
    li.dataset.state = s.state;
    const head = el("div", "mcp-head");
    const pill = el("span", "pill mcp-" + s.state, s.state);
    pill.title = { up: "connected, tools listed", down: "not reachable now",
                   off: "switched off", unknown: "not tried yet" }[s.state] || "";
    head.append(el("strong", "mcp-name", s.name), pill,
                el("span", "hint", s.transport + " · " + (s.source === "file" ? "from mcp.json" : "added here")));
    li.append(head, el("p", "hint mcp-where", where(s)));
    const secrets = secretsLine(s);
    if (secrets) li.append(el("p", "hint mcp-secrets", secrets));
    if (s.error) li.append(el("p", "error mcp-server-error", s.error));
    li.append(toolsBox(s));
    if (s.source === "file") {
      li.append(el("p", "hint mcp-file",
                   "Edited in LOKI_HOME/mcp.json; here only On and the projects change."));
    }
    const actions = el("div", "mcp-actions");
    actions.append(check("On", !!s.enabled, "on:" + s.name, (isOn) => setEnabled(s, isOn)));
    const test = D.button("Test", () => testServer(s, test));
    test.dataset.key = "test:" + s.name;
    test.setAttribute("aria-label", "Test " + s.name);
    actions.append(test);
    if (s.source === "api") {
      const edit = D.button("Edit", () => openForm(s));
      edit.setAttribute("aria-label", "Edit " + s.name);
      const del = D.button("Delete", () => remove(s), "danger");
      del.setAttribute("aria-label", "Delete " + s.name);
      actions.append(edit, del);
    }
    li.append(actions);
    const result = el("p", "hint mcp-test");
    result.setAttribute("role", "status");
    const last = tests.get(s.name);
    if (last) { result.textContent = last.text; result.dataset.ok = String(last.ok); }
    if (last && !last.ok) result.classList.add("error");
    li.append(result);
    if (projects.length) li.append(projectsBox(s));
    return li;
  }

  // Draws the list again, the focus kept on the same control (a switch, a button).
  function render() {
    const ul = $("mcp-list");
    const focused = document.activeElement && ul.contains(document.activeElement)
      ? document.activeElement.dataset.key : null;
    ul.textContent = "";
    if (!servers.length) D.emptyRow(ul, "No tool server yet.");
    for (const s of servers) ul.append(row(s));
    if (focused) {
      const again = ul.querySelector(`[data-key="${CSS.escape(focused)}"]`);
      if (again) again.focus();
    }
  }

  function replace(server) {
    if (!server || !server.name) return;
    const i = servers.findIndex((s) => s.name === server.name);
    if (i >= 0) servers[i] = server; else servers.push(server);
    servers.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  async function patch(s, body, done) {
    fail(null);
    try {
      const r = await LokiApi.apiJSON(path(s.name), { method: "PATCH", json: body });
      replace(r.server);
      status(done);
    } catch (e) { fail(e); }
    render();
  }

  const setEnabled = (s, on) => patch(s, { enabled: on }, s.name + (on ? " on" : " off"));

  function setProject(s, id, on) {
    const off = new Set(s.projects_off || []);
    if (on) off.delete(id); else off.add(id);
    const name = (projects.find((p) => p.id === id) || { name: id }).name;
    return patch(s, { projects_off: [...off].sort() }, s.name + (on ? " on in " : " off in ") + name);
  }

  async function testServer(s, button) {
    button.disabled = true;
    tests.set(s.name, { ok: true, text: "Testing " + s.name + "…" });
    const result = button.closest("li").querySelector(".mcp-test");
    result.textContent = "Testing " + s.name + "…";
    let r;
    try { r = await LokiApi.apiJSON(path(s.name) + "/test", { method: "POST" }); }
    catch (e) { tests.delete(s.name); fail(e); button.disabled = false; render(); return; }
    const t = r.test || { ok: false, error: "no answer" };
    const ms = Math.round(t.ms || 0);
    const text = t.ok
      ? "Connected in " + ms + " ms: " + t.tools.length + " tool" + (t.tools.length === 1 ? "" : "s")
        + (t.tools.length ? " (" + t.tools.join(", ") + ")" : "")
      : "Not connected (" + ms + " ms): " + (t.error || "no reason given");
    tests.set(s.name, { ok: !!t.ok, text: text });
    replace(r.server);
    render();
  }

  async function remove(s) {
    const ok = await D.ask({
      title: "Delete the tool server " + s.name + "?",
      text: "Its tools leave the model's list and its sealed headers are erased.",
      ok: "Delete", danger: true,
    });
    if (!ok) return;
    fail(null);
    try { await LokiApi.apiJSON(path(s.name), { method: "DELETE" }); }
    catch (e) { fail(e); return; }
    servers = servers.filter((x) => x.name !== s.name);
    tests.delete(s.name);
    if (editing && editing.name === s.name) closeForm();
    status("Deleted " + s.name);
    render();
  }

  // ---- the form: add an HTTP server, or edit one ---------------------------------------------
  function headerRow() {
    const div = el("div", "inline-form mcp-header-row");
    const name = el("input");
    name.setAttribute("aria-label", "Header name");
    name.placeholder = "Header name";
    name.className = "mcp-header-name";
    const value = el("input");
    value.type = "password";
    value.autocomplete = "new-password";
    value.setAttribute("aria-label", "Header value");
    value.placeholder = "value";
    value.className = "mcp-header-value";
    const drop = D.button("Remove", () => div.remove());
    drop.setAttribute("aria-label", "Remove this header");
    div.append(name, value, drop);
    $("mcp-header-rows").append(div);
    name.focus();
  }

  function setReplace(on) {
    field("replace").checked = on;
    $("mcp-headers").disabled = !on;
  }

  function openForm(s) {
    editing = s || {};
    const isNew = !s;
    const f = form();
    f.reset();
    $("mcp-header-rows").textContent = "";
    formFail(null);
    $("mcp-form-title").textContent = isNew ? "Add an HTTP server" : "Edit " + s.name;
    field("name").value = isNew ? "" : s.name;
    field("name").readOnly = !isNew;
    field("url").value = isNew ? "" : s.url || "";
    field("enabled").checked = isNew ? true : !!s.enabled;
    $("mcp-replace-row").hidden = isNew;
    const set = isNew ? [] : s.header_names || [];
    $("mcp-headers-set").hidden = isNew;
    $("mcp-headers-set").textContent = set.length
      ? "Set now: " + set.join(", ") + " (values never shown). Tick to replace them all; left unticked they stay."
      : "No header set now.";
    setReplace(isNew);
    f.hidden = false;
    (isNew ? field("name") : field("url")).focus();
  }

  function closeForm() {
    editing = null;
    form().reset(); // the password fields emptied: a token is never kept in the page
    $("mcp-header-rows").textContent = "";
    form().hidden = true;
    formFail(null);
  }

  // The headers to send: null when an edit keeps the sealed ones.
  function headersOf() {
    if (editing.name && !field("replace").checked) return null;
    const headers = {};
    const token = field("token").value.trim();
    if (token) headers.Authorization = /^bearer\s/i.test(token) ? token : "Bearer " + token;
    for (const r of $("mcp-header-rows").children) {
      const name = r.querySelector(".mcp-header-name").value.trim();
      const value = r.querySelector(".mcp-header-value").value;
      if (!name && value) throw new Error("A header value needs its header name.");
      if (name) headers[name] = value;
    }
    return headers;
  }

  async function save(ev) {
    ev.preventDefault();
    if (!editing) return;
    let headers;
    try { headers = headersOf(); } catch (e) { formFail(e); return; }
    const body = { url: field("url").value.trim(), enabled: field("enabled").checked };
    if (headers !== null) body.headers = headers;
    const isNew = !editing.name;
    if (isNew) body.name = field("name").value.trim();
    $("mcp-save").disabled = true;
    status(isNew ? "Connecting to " + body.name + "…" : "");
    let r;
    try {
      r = await LokiApi.apiJSON(isNew ? BASE : path(editing.name),
                                { method: isNew ? "POST" : "PATCH", json: body });
    } catch (e) { formFail(e); status(""); return; }
    finally { $("mcp-save").disabled = false; }
    closeForm();
    tests.delete(r.server.name); // a test of what it was before
    replace(r.server);
    status("Saved " + r.server.name + " (" + r.server.state + ")");
    render();
  }

  async function open() {
    closeForm();
    fail(null);
    status("");
    dialog.open();
    await loadProjects();
    await load();
  }

  function init() {
    dialog = D.bind("mcp-dialog", "mcp-close");
    $("mcp-btn").onclick = open;
    $("mcp-new").onclick = () => openForm(null);
    $("mcp-refresh").onclick = async () => { fail(null); await loadProjects(); await load(); };
    $("mcp-cancel").onclick = closeForm;
    $("mcp-header-add").onclick = headerRow;
    field("replace").onchange = (ev) => setReplace(ev.target.checked);
    form().onsubmit = save;
    $("mcp-dialog").addEventListener("close", closeForm);
  }

  // for the browser tests: the servers as last listed
  window.LokiMcp = { servers: () => servers, reload: load };
  init();
})();
