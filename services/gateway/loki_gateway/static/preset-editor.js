// The preset editor: the presets dialog (list, create, edit, delete, switch; a local preset's
// engine fields, its model file picked from LOKI_MODEL_DIRS by model-picker.js, or an external API's URL, model and key) against /api/presets,
// /api/presets/switch, /api/presets/test and /api/preset/cacheram; the server's validation
// message is shown in the dialog, which stays open. The key is write-only: never shown back,
// an empty field keeps the stored one. Also the engine's failure box in the sidebar (state
// "failed": detail, stderr_tail, retry_in_s, and Retry, which switches to the preset again).
// Uses window.LokiApi from app.js (and the "loki:engine" event of engine-status.js) and window.LokiDialog.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const form = () => $("preset-form");
  let presets = [];
  let active = null;
  let editing = null; // the preset being edited (a copy), or {} for a new one
  let engineInfo = null;
  const D = window.LokiDialog;
  const button = D.button;
  let dialog = null;
  const status = (text, isError) => D.status("presets-status", text, isError);
  const showError = (text) => D.error("preset-error", text);

  // ---- the list --------------------------------------------------------------------------
  async function loadList() {
    try {
      const r = await LokiApi.apiJSON("/api/presets");
      presets = r.presets || [];
      active = r.active;
    } catch (e) { status("presets: " + e.message, true); return; }
    const ul = $("presets-list");
    ul.textContent = "";
    for (const p of presets) {
      const li = document.createElement("li");
      li.dataset.id = p.id;
      const name = document.createElement("span");
      name.className = "preset-name";
      name.textContent = (p.name || p.id) + (p.external ? " · external" : "") +
        (p.id === active ? " · active" : "");
      li.appendChild(name);
      li.appendChild(button("Edit", () => edit(p)));
      if (p.id !== active) {
        li.appendChild(button("Switch", () => switchTo(p.id)));
        li.appendChild(button("Delete", () => remove(p), "danger"));
      }
      ul.appendChild(li);
    }
  }

  async function switchTo(id) {
    status("Switching…");
    try {
      const r = await LokiApi.apiJSON("/api/presets/switch", { method: "POST", json: { id: id } });
      const d = r.detail || {};
      status("Switched to " + id + (d.error ? ": " + d.error : "") +
        ((d.notes || []).length ? " · " + d.notes.join(" · ") : ""), !!d.error);
    } catch (e) { status(e.message, true); }
    await loadList();
    LokiApi.refreshEngine();
  }

  async function remove(p) {
    const ok = await D.ask({ title: "Delete the preset " + (p.name || p.id) + "?", ok: "Delete", danger: true });
    if (!ok) return;
    try {
      await LokiApi.apiJSON("/api/presets/" + encodeURIComponent(p.id), { method: "DELETE" });
      status("Deleted " + (p.name || p.id));
      if (editing && editing.id === p.id) closeForm();
    } catch (e) { status(e.message, true); }
    await loadList();
    LokiApi.refreshEngine();
  }

  // ---- the form --------------------------------------------------------------------------
  function field(name) { return form().elements[name]; }

  function setMode(external) {
    $("preset-local").hidden = external;
    $("preset-external").hidden = !external;
  }

  async function edit(p) {
    editing = JSON.parse(JSON.stringify(p || {}));
    const external = !!editing.external;
    const f = editing.features || {};
    const values = {
      id: editing.id || "", name: editing.name || "", model: editing.model || "",
      ctx: editing.ctx != null ? editing.ctx : (p ? "" : 8192), ngl: editing.ngl || "",
      parallel: editing.parallel != null ? editing.parallel : "", extra_args: editing.extra_args || "",
      ubatch: editing.ubatch != null ? editing.ubatch : "",
      "f.SIDE_SLOT": f.SIDE_SLOT || "", "f.CACHE_RAM": f.CACHE_RAM || "",
      base_url: editing.base_url || "", api_model: editing.api_model || "", api_key: "",
      max_tokens: editing.max_tokens != null ? editing.max_tokens : "",
      sampling: editing.sampling && Object.keys(editing.sampling).length ? JSON.stringify(editing.sampling) : "",
      system_prompt: editing.system_prompt || "",
    };
    for (const [k, v] of Object.entries(values)) field(k).value = v;
    await LokiModelPicker.fill(field("model"), editing.model || "");
    field("vision").checked = !!editing.vision;
    field("id").readOnly = !!editing.id;
    field("api_key").placeholder = editing.api_key_set ? "stored (empty keeps it)" : "none";
    $("preset-form-title").textContent = editing.id
      ? "Edit " + (editing.name || editing.id)
      : external ? "New external API" : "New local preset";
    $("preset-plan").textContent = "";
    $("preset-test-result").textContent = "";
    setMode(external);
    showError("");
    form().hidden = false;
    field(external ? "base_url" : "name").focus();
  }

  function closeForm() { form().hidden = true; editing = null; showError(""); }

  function intOrNull(v) { return v === "" ? null : Number(v); }

  // The preset the form describes: the edited preset's other fields kept as they were.
  function collect() {
    const out = Object.assign({}, editing);
    delete out.api_key_set;
    delete out.api_key;
    const v = (k) => field(k).value.trim();
    out.id = v("id");
    out.name = v("name");
    if (!out.id) delete out.id;
    out.max_tokens = intOrNull(v("max_tokens"));
    out.system_prompt = field("system_prompt").value;
    const sampling = v("sampling");
    try { out.sampling = sampling ? JSON.parse(sampling) : {}; }
    catch (e) { throw new Error("Sampling: not JSON (" + e.message + ")"); }
    if (out.external) {
      out.base_url = v("base_url");
      out.api_model = v("api_model");
      out.vision = field("vision").checked;
      if (field("api_key").value) out.api_key = field("api_key").value;
    } else {
      out.model = v("model");
      if (v("ctx") !== "") out.ctx = Number(v("ctx"));
      out.ngl = v("ngl") || null;
      out.parallel = intOrNull(v("parallel"));
      out.ubatch = intOrNull(v("ubatch"));
      out.extra_args = v("extra_args");
      const features = Object.assign({}, out.features || {});
      for (const k of ["SIDE_SLOT", "CACHE_RAM"]) {
        const fv = v("f." + k);
        if (fv) features[k] = fv; else delete features[k];
      }
      out.features = features;
    }
    return out;
  }

  async function save(ev) {
    ev.preventDefault();
    showError("");
    let preset;
    try { preset = collect(); } catch (e) { showError(e.message); return; }
    $("preset-save").disabled = true;
    try {
      const r = await LokiApi.apiJSON("/api/presets", { method: "POST", json: preset });
      const d = r.detail || {};
      closeForm();
      await loadList();
      status("Saved " + (r.preset.name || r.preset.id) + (d.applied ? " (applied)" : "") +
        (d.error ? ": " + d.error : "") + ((d.notes || []).length ? " · " + d.notes.join(" · ") : ""),
        !!d.error);
      LokiApi.refreshEngine();
    } catch (e) {
      showError(e.message); // the server's validation message; the dialog stays open
    } finally {
      $("preset-save").disabled = false;
    }
  }

  async function testConnection() {
    const out = $("preset-test-result");
    out.textContent = "Testing…";
    out.className = "hint";
    const body = { base_url: field("base_url").value.trim(), api_model: field("api_model").value.trim() };
    if (field("api_key").value) body.api_key = field("api_key").value;
    if (editing && editing.id) body.id = editing.id;
    try {
      const r = await LokiApi.apiJSON("/api/presets/test", { method: "POST", json: body });
      const models = (r.models || []).slice(0, 5).join(", ");
      out.textContent = r.ok
        ? "Connected" + (r.status ? " (" + r.status + ")" : "") + (models ? ": " + models : "")
        : "Failed" + (r.status ? " (" + r.status + ")" : "") + ": " + (r.message || "no answer");
      out.className = r.ok ? "hint" : "hint error";
    } catch (e) { out.textContent = e.message; out.className = "hint error"; }
  }

  // The launch plan's verdicts for the edited fields: CACHE_RAM's auto value, SIDE_SLOT.
  async function plan() {
    const q = new URLSearchParams();
    if (editing && editing.id) q.set("id", editing.id);
    for (const k of ["ctx", "ngl", "parallel", "extra_args", "model"]) {
      const val = field(k).value.trim();
      if (val) q.set(k, val);
    }
    if (field("f.SIDE_SLOT").value) q.set("side_slot", field("f.SIDE_SLOT").value);
    if (field("f.CACHE_RAM").value.trim()) q.set("cache_ram", field("f.CACHE_RAM").value.trim());
    const out = $("preset-plan");
    out.textContent = "…";
    try {
      const r = await LokiApi.apiJSON("/api/preset/cacheram?" + q.toString());
      const parts = [];
      if (r.error) parts.push(r.error);
      if (r.reason) parts.push(r.reason);
      const c = r.cache_ram;
      if (c) parts.push("CACHE_RAM auto: " + (c.effective_mib != null ? c.effective_mib : c.value_mib) +
        " MiB" + (c.reason ? " (" + c.reason + ")" : ""));
      if (r.side_slot != null) parts.push(r.side_slot
        ? "SIDE_SLOT: on" + (r.side_slot_mib != null ? ", second slot " + r.side_slot_mib + " MiB" : "")
        : "SIDE_SLOT: off" + (r.side_slot_refusal ? " (" + r.side_slot_refusal + ")" : ""));
      for (const n of r.notes || []) parts.push(n);
      out.textContent = parts.join(" · ") || "no verdict";
    } catch (e) { out.textContent = e.message; }
  }

  function open() {
    status("");
    closeForm();
    dialog.open();
    LokiModelPicker.load();
    loadList();
  }

  // ---- the engine's failure box ------------------------------------------------------------
  function showFailure(info) {
    engineInfo = info;
    const failed = !!info && info.state === "failed";
    $("engine-failure").hidden = !failed;
    if (!failed) return;
    $("engine-failure-detail").textContent = info.detail || "The engine failed.";
    const tail = info.stderr_tail || [];
    $("engine-failure-tail").textContent = tail.slice(-8).join("\n");
    $("engine-failure-tail").hidden = !tail.length;
    $("engine-failure-retry").textContent = info.retry_in_s != null
      ? "Next try in " + Math.max(0, Math.round(info.retry_in_s)) + " s."
      : "Not retried by itself: fix the preset, or retry.";
  }

  async function retry() {
    const id = (engineInfo && engineInfo.preset_id) || $("preset-picker").value;
    if (!id) return;
    $("engine-retry").disabled = true;
    try { await LokiApi.apiJSON("/api/presets/switch", { method: "POST", json: { id: id } }); }
    catch (e) { $("engine-failure-retry").textContent = e.message; }
    finally { $("engine-retry").disabled = false; }
    LokiApi.refreshEngine();
  }

  function init() {
    dialog = D.bind("presets-dialog", "presets-close");
    $("presets-btn").onclick = open;
    $("preset-new-local").onclick = () => edit(null);
    $("preset-new-external").onclick = () => edit({ external: true });
    $("preset-cancel").onclick = closeForm;
    $("preset-test").onclick = testConnection;
    $("preset-plan-btn").onclick = plan;
    form().onsubmit = save;
    $("engine-retry").onclick = retry;
    document.addEventListener("loki:engine", (ev) => showFailure(ev.detail));
  }

  window.LokiPresets = { open: open, reload: loadList };
  init();
})();
