// Measuring the engine, in the presets dialog (its own section, apart from the preset form):
// "Benchmark" starts /api/engine/bench on the preset in service and shows its progress (a
// <progress> fed by GET /api/engine/bench every second), then a small chart of the median
// speeds by depth (pp and tg) of this run beside the earlier runs of the preset, and a table
// with the spread. "Optimise…" (opt-in: asks first, in Loki's own dialog) starts /api/engine/optimise, shows its
// progress and its table, and proposes the fastest settings as a diff that "Apply to the
// preset" saves through /api/presets (Loki never applies it by itself). Cancel stops either.
// A refusal (external preset, a turn running) is shown as the server's message.
// Uses window.LokiApi from app.js and window.LokiDialog.ask (Loki's own question).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  let timer = null;
  let current = null; // "bench" | "optimise" while a job runs

  function status(text, isError) {
    const p = $("bench-status");
    p.textContent = text;
    p.classList.toggle("error", !!isError);
  }

  function showProgress(job) {
    const bar = $("bench-progress");
    const running = job && job.state === "running";
    bar.hidden = !running;
    $("measure-cancel").hidden = !running;
    $("bench-start").disabled = running;
    $("optimise-start").disabled = running;
    if (!job || job.state === "idle") return;
    bar.max = Math.max(1, job.total);
    bar.value = job.done;
    const what = job.kind === "optimise" ? "Optimiser" : "Benchmark";
    if (running) status(what + ": " + job.done + "/" + job.total + " · " + (job.step || ""));
    else if (job.state === "failed") status(what + " failed: " + (job.error || ""), true);
    else if (job.state === "cancelled") status(what + " " + (job.step || "cancelled"));
    else status(what + " done");
  }

  function el(tag, attrs, text) {
    const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text != null) e.textContent = text;
    return e;
  }

  const fmt = (v) => (v == null ? "–" : v >= 100 ? v.toFixed(0) : v.toFixed(1));

  // The chart: for pp and tg, one bar per run (oldest to newest, the newest darkest) at each depth.
  function drawRuns(runs) {
    const box = $("bench-chart");
    box.textContent = "";
    runs = (runs || []).slice(-5);
    if (!runs.length) return;
    const depths = [...new Set(runs.flatMap((r) => r.points.map((p) => p.depth)))].sort((a, b) => a - b);
    for (const test of ["pp", "tg"]) {
      const vals = runs.flatMap((r) => r.points.filter((p) => p.test === test).map((p) => p.median || 0));
      const max = Math.max(1, ...vals);
      const w = 300, h = 90, gw = w / depths.length, bw = Math.max(3, (gw - 8) / runs.length);
      const svg = el("svg:svg", { viewBox: `0 0 ${w} ${h + 16}`, class: "bench-chart", role: "img",
        "aria-label": test + " tokens per second by depth, " + runs.length + " run(s)" });
      depths.forEach((d, i) => {
        runs.forEach((r, j) => {
          const p = r.points.find((q) => q.test === test && q.depth === d);
          if (!p || p.median == null) return;
          const bh = (p.median / max) * h;
          const bar = el("svg:rect", { x: i * gw + 4 + j * bw, y: h - bh, width: bw - 1, height: bh,
            class: j === runs.length - 1 ? "bench-bar latest" : "bench-bar" });
          bar.appendChild(el("svg:title", {}, `${test} @ ${d}: ${fmt(p.median)} tok/s (${fmt(p.low)}–${fmt(p.high)})`));
          svg.appendChild(bar);
        });
        svg.appendChild(el("svg:text", { x: i * gw + gw / 2, y: h + 13, "text-anchor": "middle", class: "bench-label" }, "d" + d));
      });
      const fig = el("figure", { class: "bench-figure" });
      fig.appendChild(svg);
      const last = runs[runs.length - 1].points.filter((p) => p.test === test);
      fig.appendChild(el("figcaption", {}, test + " tok/s · latest: " +
        last.map((p) => "d" + p.depth + " " + fmt(p.median) + " (±" + fmt((p.high - p.low) / 2) + ")").join(", ")));
      box.appendChild(fig);
    }
  }

  function drawSearch(result) {
    const box = $("optimise-result");
    box.textContent = "";
    if (!result || !result.table || !result.table.length) return;
    const table = el("table", { class: "optimise-table" });
    const head = el("tr");
    for (const t of ["settings", "verdict", "pp", "tg", "score"]) head.appendChild(el("th", {}, t));
    table.appendChild(head);
    result.table.forEach((row, i) => {
      const tr = el("tr", i === result.best ? { class: "best" } : {});
      tr.appendChild(el("td", {}, i === 0 ? "preset as it is" : JSON.stringify(row.settings)));
      tr.appendChild(el("td", {}, row.verdict + (row.reason ? ": " + row.reason : "")));
      tr.appendChild(el("td", {}, fmt(row.pp)));
      tr.appendChild(el("td", {}, fmt(row.tg)));
      tr.appendChild(el("td", {}, row.score == null ? "–" : row.score.toFixed(2)));
      table.appendChild(tr);
    });
    box.appendChild(table);
    const diff = result.diff || {};
    if (!Object.keys(diff).length) {
      box.appendChild(el("p", { class: "hint" }, result.best == null ? "No proposal." : "The preset as it is was the fastest."));
      return;
    }
    box.appendChild(el("p", { class: "hint", id: "optimise-diff" }, "Proposed: " + JSON.stringify(diff)));
    const apply = el("button", { type: "button", id: "optimise-apply" }, "Apply to the preset");
    apply.addEventListener("click", () => applyDiff(result.preset_id, diff));
    box.appendChild(apply);
  }

  async function applyDiff(presetId, diff) {
    try {
      const r = await LokiApi.apiJSON("/api/presets");
      const preset = (r.presets || []).find((p) => p.id === presetId);
      if (!preset) throw new Error("preset " + presetId + " not found");
      const body = Object.assign({}, preset, diff);
      delete body.api_key;
      delete body.api_key_set;
      await LokiApi.apiJSON("/api/presets", { method: "POST", json: body });
      status("Applied to " + (preset.name || preset.id));
      LokiApi.refreshEngine();
    } catch (e) { status(e.message, true); }
  }

  async function poll() {
    clearTimeout(timer);
    const path = current === "optimise" ? "/api/engine/optimise" : "/api/engine/bench";
    try {
      const r = await LokiApi.apiJSON(path);
      if (current === "optimise") drawSearch(r.result); else drawRuns(r.runs);
      showProgress(r.job);
      if (r.job && r.job.state === "running") { timer = setTimeout(poll, 1000); return; }
      if (current === "optimise") LokiApi.refreshEngine();
    } catch (e) { status(e.message, true); }
    current = null;
  }

  async function start(kind) {
    if (kind === "optimise" && !(await LokiDialog.ask({
      title: "Optimise the engine?",
      text: "The optimiser launches the engine again with several settings and benchmarks " +
        "each (minutes; a turn that starts meanwhile stops it). Nothing is applied unless you " +
        "apply the proposal.",
      ok: "Optimise",
    }))) return;
    try {
      const r = await LokiApi.apiJSON("/api/engine/" + kind, { method: "POST", json: {} });
      current = kind;
      showProgress(r.job);
      timer = setTimeout(poll, 500);
    } catch (e) { status(e.message, true); }
  }

  async function cancel() {
    if (!current) return;
    try { await LokiApi.apiJSON("/api/engine/" + current, { method: "DELETE" }); }
    catch (e) { status(e.message, true); }
    poll();
  }

  // The dialog opened: show the stored runs and the last search (and a job still running).
  async function refresh() {
    try {
      const [b, o] = await Promise.all([
        LokiApi.apiJSON("/api/engine/bench"), LokiApi.apiJSON("/api/engine/optimise")]);
      drawRuns(b.runs);
      drawSearch(o.result);
      const job = [b.job, o.job].find((j) => j && j.state === "running");
      showProgress(job || b.job);
      if (job) { current = job.kind; poll(); }
    } catch (e) { status(e.message, true); }
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (!$("engine-measure")) return;
    $("bench-start").addEventListener("click", () => start("bench"));
    $("optimise-start").addEventListener("click", () => start("optimise"));
    $("measure-cancel").addEventListener("click", cancel);
    $("presets-btn").addEventListener("click", refresh);
  });
  window.LokiMeasure = { refresh: refresh };
})();
