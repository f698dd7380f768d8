// Scheduled tasks: the tasks dialog (list, create, edit, switch on/off, delete) against
// /api/tasks, and a task's runs (/api/tasks/{id}/runs: due time, status, detail), each run's
// conversation opened in the main view from here (the sidebar lists only the person's). A
// schedule is a cron expression or an interval in seconds, in a time zone (the browser's by
// default); the server's validation message is shown in the dialog, which stays open. As the
// schedule is typed, the form shows its next three run times in its time zone, or why it is
// refused (POST /api/tasks/preview), before anything is saved. Uses window.LokiApi from
// app.js and window.LokiDialog (dialog.js).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const form = () => $("task-form");
  const field = (name) => form().elements[name];
  const D = window.LokiDialog;
  const button = D.button;
  let dialog = null;
  let tasks = [];
  let editing = null; // the task being edited, or {} for a new one
  let showingRuns = null; // the task whose runs are shown

  function localZone() {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC"; } catch (e) { return "UTC"; }
  }

  const status = (text, isError) => D.status("tasks-status", text, isError);
  const showError = (text) => D.error("task-error", text);

  function schedule(t) {
    return (t.cron ? "cron " + t.cron : "every " + t.interval_s + " s") + " · " + t.tz;
  }

  function spec(t, over) {
    const s = { name: t.name, prompt: t.prompt, cron: t.cron, interval_s: t.interval_s,
                tz: t.tz, project: t.project, enabled: t.enabled };
    return Object.assign(s, over || {});
  }

  // ---- the list --------------------------------------------------------------------------
  async function loadList() {
    try { tasks = (await LokiApi.apiJSON("/api/tasks")).tasks || []; }
    catch (e) { status("tasks: " + e.message, true); return; }
    const ul = $("tasks-list");
    ul.textContent = "";
    if (!tasks.length) D.emptyRow(ul, "No task yet.");
    for (const t of tasks) {
      const li = document.createElement("li");
      li.dataset.id = t.id;
      const name = document.createElement("span");
      name.className = "task-name";
      name.textContent = (t.name || t.prompt.slice(0, 40)) + " · " + schedule(t) +
        (t.enabled ? "" : " · off");
      const toggle = document.createElement("label");
      toggle.className = "check";
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = t.enabled;
      box.setAttribute("aria-label", "On");
      box.onchange = () => setEnabled(t, box.checked);
      toggle.append(box, " On");
      li.append(name, toggle, button("Edit", () => edit(t)), button("Runs", () => showRuns(t)),
                button("Delete", () => remove(t), "danger"));
      ul.appendChild(li);
    }
  }

  async function setEnabled(t, on) {
    try {
      await LokiApi.apiJSON("/api/tasks/" + t.id, { method: "PUT", json: spec(t, { enabled: on }) });
      status((t.name || "Task") + (on ? " on" : " off"));
    } catch (e) { status(e.message, true); }
    await loadList();
  }

  async function remove(t) {
    const ok = await D.ask({ title: "Delete the task " + (t.name || t.prompt.slice(0, 40)) + "?",
                             ok: "Delete", danger: true });
    if (!ok) return;
    try {
      await LokiApi.apiJSON("/api/tasks/" + t.id, { method: "DELETE" });
      status("Deleted " + (t.name || "the task"));
      if (editing && editing.id === t.id) closeForm();
      if (showingRuns && showingRuns.id === t.id) closeRuns();
    } catch (e) { status(e.message, true); }
    await loadList();
  }

  // ---- the form --------------------------------------------------------------------------
  function setKind(kind) {
    field("kind").value = kind;
    field("cron").closest("label").hidden = kind !== "cron";
    field("interval_s").closest("label").hidden = kind !== "interval";
  }

  function edit(t) {
    editing = t ? Object.assign({}, t) : {};
    closeRuns();
    const values = {
      name: editing.name || "", prompt: editing.prompt || "", cron: editing.cron || "",
      interval_s: editing.interval_s != null ? editing.interval_s : 3600,
      tz: editing.tz || localZone(), project: editing.project || "",
    };
    for (const [k, v] of Object.entries(values)) field(k).value = v;
    field("enabled").checked = t ? !!t.enabled : true;
    setKind(editing.cron ? "cron" : "interval");
    $("task-form-title").textContent = t ? "Edit " + (t.name || "task") : "New task";
    showError("");
    showNext("");
    form().hidden = false;
    previewSoon();
    field("prompt").focus();
  }

  function closeForm() { editing = null; form().hidden = true; showError(""); }

  // ---- the next run times, as the schedule is typed ---------------------------------------
  let previewTimer = null;
  let previewSeq = 0;

  function scheduleOf() {
    const kind = field("kind").value;
    return {
      cron: kind === "cron" ? field("cron").value.trim() : null,
      interval_s: kind === "interval" ? Number(field("interval_s").value) : null,
      tz: field("tz").value.trim() || "UTC",
    };
  }

  function showNext(text, isError) {
    const p = $("task-next");
    p.textContent = text;
    p.classList.toggle("error", !!isError);
    p.dataset.state = isError ? "error" : (text ? "ok" : "");
  }

  function previewSoon() {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(preview, 250);
  }

  async function preview() {
    if (!editing) return;
    const body = scheduleOf();
    if (body.cron === "") { showNext(""); return; }
    const seq = ++previewSeq;
    let reply;
    try {
      reply = await LokiApi.apiJSON("/api/tasks/preview", { method: "POST", json: body });
    } catch (e) {
      if (seq === previewSeq) showNext(e.message, true);
      return;
    }
    if (seq !== previewSeq) return; // a later keystroke's answer wins
    const when = (reply.next_runs || []).map((r) => r.local.replace("T", " "));
    showNext("Next runs (" + reply.tz + "): " + when.join(" · "));
  }

  async function save(ev) {
    ev.preventDefault();
    if (!editing) return;
    const kind = field("kind").value;
    const body = {
      name: field("name").value.trim(),
      prompt: field("prompt").value,
      cron: kind === "cron" ? field("cron").value.trim() : null,
      interval_s: kind === "interval" ? Number(field("interval_s").value) : null,
      tz: field("tz").value.trim() || "UTC",
      project: field("project").value.trim() || null,
      enabled: field("enabled").checked,
    };
    const path = editing.id ? "/api/tasks/" + editing.id : "/api/tasks";
    try {
      await LokiApi.apiJSON(path, { method: editing.id ? "PUT" : "POST", json: body });
    } catch (e) { showError(e.message); return; }
    status("Saved " + (body.name || "the task"));
    closeForm();
    await loadList();
  }

  // ---- the runs --------------------------------------------------------------------------
  function closeRuns() { showingRuns = null; $("task-runs").hidden = true; }

  async function showRuns(t) {
    closeForm();
    showingRuns = t;
    $("task-runs-title").textContent = "Runs of " + (t.name || t.prompt.slice(0, 40));
    $("task-runs").hidden = false;
    let runs = [];
    try { runs = (await LokiApi.apiJSON("/api/tasks/" + t.id + "/runs")).runs || []; }
    catch (e) { status(e.message, true); return; }
    const ul = $("task-runs-list");
    ul.textContent = "";
    if (!runs.length) D.emptyRow(ul, "No run yet.");
    for (const r of runs) {
      const li = document.createElement("li");
      li.dataset.status = r.status;
      const when = document.createElement("span");
      when.className = "run-when";
      when.textContent = new Date(r.due * 1000).toLocaleString();
      const st = document.createElement("span");
      st.className = "pill run-" + r.status;
      st.textContent = r.status;
      li.append(when, st);
      if (r.conversation) {
        li.appendChild(button("Open", () => {
          dialog.close();
          LokiApi.openTaskRun(r.conversation, "Task: " + (t.name || t.prompt.slice(0, 40)));
        }));
      }
      if (r.detail) {
        const d = document.createElement("p");
        d.className = "hint run-detail";
        d.textContent = r.detail;
        li.appendChild(d);
      }
      ul.appendChild(li);
    }
  }

  async function open() {
    closeForm();
    closeRuns();
    status("");
    dialog.open();
    await loadList();
  }

  function init() {
    dialog = D.bind("tasks-dialog", "tasks-close");
    $("tasks-btn").onclick = open;
    $("task-new").onclick = () => edit(null);
    $("task-cancel").onclick = closeForm;
    $("task-runs-close").onclick = closeRuns;
    $("task-runs-refresh").onclick = () => { if (showingRuns) showRuns(showingRuns); };
    field("kind").onchange = (ev) => { setKind(ev.target.value); previewSoon(); };
    for (const name of ["cron", "interval_s", "tz"]) field(name).addEventListener("input", previewSoon);
    form().onsubmit = save;
  }

  init();
})();
