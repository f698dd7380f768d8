// Projects in the sidebar and their memory (/api/projects…, answered by the memory service):
// - the switcher: every project, the active one selected, "+ New project…"; switching makes it
//   active (new conversations belong to it) and the conversation list shows its conversations;
//   without a memory service the row stays hidden and the list shows every conversation;
// - the dialog (Memory): pages (a list, a Markdown editor with a preview; MEMORY.md is kept by
//   Loki and shown read-only), trackers (the latest values, a chart per tracker drawn with the
//   vendored uPlot at one of three levels, a form to log a value) and the project's settings
//   (name, description, instructions, export zip, import zip, delete after a confirmation).
// Uses window.LokiApi from app.js, window.LokiMarkdown for the preview, window.LokiDialog.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const NEW = "__new__";
  let activeId = null;
  let projects = [];
  let openPage = null;
  let openTracker = null;
  let plot = null;
  let dialog = null;

  function base() { return "/api/projects/" + enc(activeId); }

  const fail = (e) => LokiDialog.error("project-error", e);

  async function refresh() {
    let reply;
    try { reply = await LokiApi.apiJSON("/api/projects"); }
    catch (e) { $("project-row").hidden = true; activeId = null; return; }
    projects = reply.projects || [];
    const changed = activeId !== reply.active;
    activeId = reply.active;
    const sel = $("project-picker");
    sel.textContent = "";
    for (const p of projects) sel.add(new Option(p.name, p.id, false, p.id === activeId));
    sel.add(new Option("+ New project…", NEW));
    sel.value = activeId;
    $("project-row").hidden = false;
    if (changed) LokiApi.loadConversations();
  }

  async function activate(id) {
    await LokiApi.apiJSON("/api/projects/active", { method: "PUT", json: { project: id } });
    await refresh();
    LokiApi.openConversation(null);
    await LokiApi.loadConversations();
  }

  async function onPick(ev) {
    const id = ev.target.value;
    if (id !== NEW) { try { await activate(id); } catch (e) { await refresh(); } return; }
    ev.target.value = activeId; // until the new one exists
    const name = await LokiDialog.ask({ title: "New project", label: "Name", value: "", ok: "Create" });
    if (!name || !name.trim()) return;
    try {
      const made = await LokiApi.apiJSON("/api/projects", { method: "POST", json: { name: name.trim() } });
      await activate(made.project.id);
    } catch (e) { LokiApi.notice("Project not created: " + e.message, "error", 8000); await refresh(); }
  }

  // ---- the dialog ----------------------------------------------------------------------
  function showTab(name) {
    for (const b of document.querySelectorAll("#project-dialog .tabs button")) {
      b.classList.toggle("on", b.dataset.tab === name);
    }
    for (const t of ["pages", "trackers", "settings"]) $("tab-" + t).hidden = t !== name;
    if (name === "trackers" && openTracker) drawTracker(openTracker);
  }

  async function openDialog() {
    if (!activeId) return;
    const project = projects.find((p) => p.id === activeId) || { name: activeId };
    $("project-title").textContent = project.name;
    fail(null);
    dialog.open();
    showTab("pages");
    fillSettings(project);
    await Promise.all([loadPages(), loadTrackers()]);
  }

  // ---- pages ---------------------------------------------------------------------------
  async function loadPages() {
    let reply;
    try { reply = await LokiApi.apiJSON(base() + "/pages"); } catch (e) { fail(e); return; }
    fillList($("page-list"), reply.pages, (p) => ({
      key: ["file", p.file], on: p.file === openPage, title: p.title,
      desc: p.description || p.file, open: () => editPage(p.file),
    }));
    $("page-index").textContent = reply.index || "(no page yet)";
  }

  async function editPage(file) {
    const form = $("page-form");
    fail(null);
    $("page-preview").hidden = true;
    if (file === null) {
      openPage = null;
      form.reset();
      form.page.readOnly = false;
      $("page-delete").hidden = true;
    } else {
      let page;
      try { page = await LokiApi.apiJSON(base() + "/pages/" + enc(file)); } catch (e) { fail(e); return; }
      openPage = page.file;
      form.page.value = page.file;
      form.page.readOnly = true;
      form.description.value = page.description || "";
      form.content.value = page.content;
      $("page-delete").hidden = false;
    }
    form.hidden = false;
    for (const li of $("page-list").children) li.classList.toggle("on", li.dataset.file === openPage);
    (file === null ? form.page : form.content).focus();
  }

  async function savePage(ev) {
    ev.preventDefault();
    const form = $("page-form");
    const name = form.page.value.trim();
    if (!name) return;
    try {
      const r = await LokiApi.apiJSON(base() + "/pages/" + enc(name), {
        method: "PUT", json: { content: form.content.value, description: form.description.value },
      });
      openPage = r.page.file;
      form.page.value = r.page.file;
      form.page.readOnly = true;
      $("page-delete").hidden = false;
      fail(null);
    } catch (e) { fail(e); return; }
    await loadPages();
  }

  async function deletePage() {
    if (!openPage) return;
    const ok = await LokiDialog.ask({ title: "Delete the page " + openPage + "?", text: "Its text is removed from the project's memory.", ok: "Delete", danger: true });
    if (!ok) return;
    try { await LokiApi.apiJSON(base() + "/pages/" + enc(openPage), { method: "DELETE" }); }
    catch (e) { fail(e); return; }
    openPage = null;
    $("page-form").hidden = true;
    await loadPages();
  }

  function preview() {
    const box = $("page-preview");
    box.innerHTML = LokiMarkdown.render($("page-form").content.value);
    box.hidden = false;
  }

  // ---- trackers ------------------------------------------------------------------------
  async function loadTrackers() {
    let reply;
    try { reply = await LokiApi.apiJSON(base() + "/trackers"); } catch (e) { fail(e); return; }
    const ul = $("tracker-list");
    fillList(ul, reply.trackers, (t) => ({
      key: ["slug", t.slug], on: t.slug === openTracker, title: t.name,
      desc: t.latest
        ? `${t.latest.value} ${t.unit} (${t.latest.date}) · ${t.count} value${t.count === 1 ? "" : "s"}`
        : "no value yet",
      open: () => { openTracker = t.slug; drawTracker(t.slug); loadTrackers(); },
    }));
    if (!reply.trackers.length) LokiDialog.emptyRow(ul, "No tracker yet: log a first value below.", "desc");
  }

  // A list of rows, each a title and a description in a button that opens it; `row(item)`
  // gives {key: [dataset name, value], on, title, desc, open}.
  function fillList(ul, items, row) {
    ul.textContent = "";
    for (const item of items) {
      const r = row(item);
      const li = document.createElement("li");
      li.dataset[r.key[0]] = r.key[1];
      li.classList.toggle("on", r.on);
      const title = document.createElement("span");
      title.textContent = r.title;
      const desc = document.createElement("span");
      desc.className = "desc";
      desc.textContent = r.desc;
      li.append(title, desc);
      rowButton(li, r.open);
      ul.appendChild(li);
    }
  }

  // A list row that opens something: its content in a button (reached by Tab, opened by a
  // click, Enter or Space).
  function rowButton(li, open) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "row-open";
    b.append(...li.childNodes);
    b.onclick = open;
    li.appendChild(b);
  }

  function dayOf(period) {
    // "2026", "2026-11" or "2026-11-30" -> Unix seconds at the start of it (UTC)
    const [y, m, d] = period.split("-").map(Number);
    return Date.UTC(y, (m || 1) - 1, d || 1) / 1000;
  }

  async function drawTracker(slug) {
    const level = $("tracker-level").value;
    let r;
    try { r = await LokiApi.apiJSON(base() + "/trackers/" + enc(slug) + "?level=" + level); }
    catch (e) { fail(e); return; }
    $("tracker-view").hidden = false;
    $("tracker-name").textContent = r.tracker.name + (r.tracker.unit ? " (" + r.tracker.unit + ")" : "");
    $("tracker-text").textContent = r.text || "";
    // [x (Unix s), y, the date as the tracker names it: YYYY-MM-DD, YYYY-MM or YYYY]
    const points = level === "events"
      ? r.events.map((e) => [dayOf(e.date), e.value, e.date])
      : r.periods.map((p) => [dayOf(p.period), p.mean, p.period]);
    const box = $("tracker-chart");
    if (plot) { plot.destroy(); plot = null; }
    box.textContent = "";
    box.dataset.points = String(points.length);
    if (!points.length || $("tab-trackers").hidden) return;
    const width = Math.max(200, box.clientWidth || 300);
    const label = level === "events" ? r.tracker.name : r.tracker.name + " (mean)";
    const names = new Map(points.map((p) => [p[0], p[2]]));
    const dateOf = (x) => names.get(x) || new Date(x * 1000).toISOString().slice(0, 10);
    // the time axis shows the points' own dates (a day, a month, a year), never hours; the
    // labels drawn are kept in data-ticks
    const labels = (u, splits) => {
      const out = splits.map(dateOf);
      box.dataset.ticks = JSON.stringify(out);
      return out;
    };
    // no legend (its "Time: – Weight: --" said nothing until hovered); room on the right for
    // the last date label, centred on the last point
    plot = new uPlot({
      width: width,
      height: 220,
      padding: [12, 48, 0, 0],
      legend: { show: false },
      series: [
        { value: (u, x) => (x == null ? "–" : dateOf(x)) },
        { label: label, stroke: "#3b5bdb", width: 2, points: { show: true, size: 6 } },
      ],
      axes: [
        { stroke: "#6b7385", splits: () => dateTicks(points, width), values: labels },
        { stroke: "#6b7385" },
      ],
      scales: { x: { time: true } },
    }, [points.map((p) => p[0]), points.map((p) => p[1])], box);
  }

  // The x axis's ticks: the points' distinct x, every k-th so that labels about 90 px wide
  // fit in `width`, the first always kept.
  function dateTicks(points, width) {
    const xs = [...new Set(points.map((p) => p[0]))];
    const step = Math.ceil(xs.length / Math.max(1, Math.floor(width / 90)));
    return xs.filter((_, i) => i % step === 0);
  }

  async function logValue(ev) {
    ev.preventDefault();
    const f = $("tracker-form");
    const body = { value: Number(f.elements.namedItem("value").value) };
    if (f.unit.value.trim()) body.unit = f.unit.value.trim();
    if (f.date.value) body.date = f.date.value;
    let r;
    try {
      r = await LokiApi.apiJSON(base() + "/trackers/" + enc(f.tracker.value.trim()) + "/values", {
        method: "POST", json: body,
      });
    } catch (e) { fail(e); return; }
    fail(null);
    f.elements.namedItem("value").value = "";
    openTracker = r.tracker.slug;
    await loadTrackers();
    await drawTracker(openTracker);
  }

  // ---- settings, export, import, delete ------------------------------------------------
  function fillSettings(project) {
    const f = $("project-form");
    f.elements.namedItem("name").value = project.name || "";
    f.description.value = project.description || "";
    f.instructions.value = project.instructions || "";
  }

  async function saveSettings(ev) {
    ev.preventDefault();
    const f = $("project-form");
    try {
      await LokiApi.apiJSON(base(), {
        method: "PATCH",
        json: { name: f.elements.namedItem("name").value.trim(), description: f.description.value, instructions: f.instructions.value },
      });
      fail(null);
    } catch (e) { fail(e); return; }
    await refresh();
    $("project-title").textContent = f.elements.namedItem("name").value.trim();
  }

  async function exportProject() {
    const resp = await LokiApi.api(base() + "/export");
    if (!resp.ok) { fail(new Error("export failed: " + resp.status)); return; }
    const url = URL.createObjectURL(await resp.blob());
    const a = document.createElement("a");
    const m = /filename="([^"]+)"/.exec(resp.headers.get("Content-Disposition") || "");
    a.href = url; a.download = m ? m[1] : "loki-project-" + activeId + ".zip";
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  async function importProject(ev) {
    const file = ev.target.files[0];
    ev.target.value = "";
    if (!file) return;
    const resp = await LokiApi.api("/api/projects/import", {
      method: "POST", body: file, headers: { "Content-Type": "application/zip" },
    });
    const body = await resp.json().catch(() => null);
    if (!resp.ok) { fail(new Error(body && body.error ? body.error.message : "import failed")); return; }
    dialog.close();
    await activate(body.project.id);
  }

  async function deleteProject() {
    const typed = await LokiDialog.ask({
      title: "Delete this project?",
      text: `"${activeId}" goes with its pages, trackers and conversations. Type its id to confirm.`,
      label: "Project id", value: "", ok: "Delete", danger: true,
    });
    if (typed === null) return;
    if (typed.trim() !== activeId) { fail(new Error("Not deleted: the id typed is not " + activeId)); return; }
    try {
      await LokiApi.apiJSON(base() + "?confirm=" + enc(activeId), { method: "DELETE" });
    } catch (e) { fail(e); return; }
    dialog.close();
    await refresh();
    LokiApi.openConversation(null);
    await LokiApi.loadConversations();
  }

  function init() {
    $("project-picker").onchange = onPick;
    dialog = LokiDialog.bind("project-dialog", "project-close");
    $("project-btn").onclick = openDialog;
    for (const b of document.querySelectorAll("#project-dialog .tabs button")) {
      b.onclick = () => showTab(b.dataset.tab);
    }
    $("page-new").onclick = () => editPage(null);
    $("page-form").onsubmit = savePage;
    $("page-delete").onclick = deletePage;
    $("page-preview-btn").onclick = preview;
    $("tracker-form").onsubmit = logValue;
    $("tracker-level").onchange = () => { if (openTracker) drawTracker(openTracker); };
    $("project-form").onsubmit = saveSettings;
    $("project-export").onclick = exportProject;
    $("project-import").onchange = importProject;
    $("project-delete").onclick = deleteProject;
    refresh();
  }

  // plot(): the tracker's uPlot chart (null: none drawn), for the browser tests
  window.LokiProjects = { active: () => activeId, refresh: refresh, plot: () => plot };
  init();
})();
