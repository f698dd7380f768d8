// The preset editor's model-file picker: a <select> filled from GET /api/preset/models (the
// GGUF files under the supervisor's LOKI_MODEL_DIRS, with size and architecture). The empty
// value is the bundled model. A preset's file that is not in the list (a path set by hand or
// from the environment) is kept as an extra option, so editing never changes it silently.
// Uses window.LokiApi from app.js.
"use strict";

window.LokiModelPicker = (function () {
  let listing = null; // the last answer, or a promise of it

  function size(bytes) {
    if (bytes == null) return "?";
    const gib = bytes / 1073741824;
    return gib >= 1 ? gib.toFixed(1) + " GiB" : Math.round(bytes / 1048576) + " MiB";
  }

  function label(f) {
    return f.name + " · " + size(f.size_bytes) + " · " + (f.architecture || "unreadable");
  }

  function option(value, text) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = text;
    return o;
  }

  // Fetch the list again (each time the presets dialog opens).
  function load() {
    listing = LokiApi.apiJSON("/api/preset/models").catch((e) => ({ error: e.message, files: [] }));
    return listing;
  }

  // Fill `select` and choose `current` ("" = the bundled model).
  async function fill(select, current) {
    const r = await (listing || load());
    select.textContent = "";
    const b = r.bundled;
    select.appendChild(option("", "bundled model" + (b ? " (" + label(b) + ")" : "")));
    for (const f of r.files || []) {
      const o = option(f.path, label(f));
      o.title = f.path + (f.error ? " · " + f.error : "");
      select.appendChild(o);
    }
    if (current && !(r.files || []).some((f) => f.path === current)) {
      select.appendChild(option(current, current + " (not under LOKI_MODEL_DIRS)"));
    }
    select.value = current || "";
    const dirs = (r.dirs || []).map((d) => d.path + (d.exists ? "" : " (missing)"));
    select.title = r.error ? "model list: " + r.error
      : dirs.length ? "GGUF files under " + dirs.join(", ") : "LOKI_MODEL_DIRS is not set";
  }

  return { load: load, fill: fill };
})();
