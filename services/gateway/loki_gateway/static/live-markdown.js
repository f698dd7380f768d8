// Incremental Markdown for a reply that is still streaming (issue 17: an open tab must not slow
// the engine down). The text is cut into closed blocks — a blank line outside a code fence,
// followed by a line that is neither indented nor a list item (so an indented continuation,
// an indented code block or a loose list stays whole) — each rendered once and appended; only the open block at the end is parsed again
// on each render. When the reply ends, it is rendered once whole, so the result is exactly
// what a finished reply renders to.
//
//   const live = LokiLive.create(el);   // el: the bubble, emptied
//   live.append(text);                  // cheap: no parsing
//   live.render();                      // parses the new closed blocks and the open block
//   live.finish();                      // the whole text, once
//   live.text                           // all the text so far
"use strict";

(function () {
  const md = window.LokiMarkdown;
  const FENCE = /^ {0,3}(```|~~~)/;
  // A list item after a blank line may continue the list above (a loose list): no cut there.
  const LIST_ITEM = /^([-*+]|\d{1,9}[.)])(\s|$)/;

  // Render counters, for the browser benchmark (bench/ui_render_bench.py).
  const stats = { renders: 0, ms: 0, parsedChars: 0 };

  function create(el) {
    el.textContent = "";
    const live = document.createElement("div");
    live.className = "live";
    el.appendChild(live);
    return {
      el: el,
      text: "",
      frozen: 0,        // characters already rendered into closed blocks
      scanned: 0,       // characters already scanned for block ends (whole lines only)
      inFence: false,
      pendingCut: 0,    // after a blank line: the cut, if the next line is not indented
      cut: 0,           // end of the last closed block
      finished: false,
      append(s) { this.text += s; },
      render() { if (!this.finished) timed(() => renderOpen(this, live)); },
      finish() {
        if (this.finished) return;
        this.finished = true;
        timed(() => { el.innerHTML = md.render(this.text); stats.parsedChars += this.text.length; });
      },
    };
  }

  function timed(fn) {
    const t0 = performance.now();
    fn();
    stats.renders++;
    stats.ms += performance.now() - t0;
  }

  function scan(r) {
    let nl;
    while ((nl = r.text.indexOf("\n", r.scanned)) >= 0) {
      const line = r.text.slice(r.scanned, nl);
      if (line.trim() === "") {
        if (!r.inFence) r.pendingCut = nl + 1;
      } else {
        if (r.pendingCut && !/^\s/.test(line) && !LIST_ITEM.test(line)) r.cut = r.pendingCut;
        r.pendingCut = 0;
        if (FENCE.test(line)) r.inFence = !r.inFence;
      }
      r.scanned = nl + 1;
    }
  }

  function renderOpen(r, live) {
    scan(r);
    if (r.cut > r.frozen) {
      const closed = r.text.slice(r.frozen, r.cut);
      live.insertAdjacentHTML("beforebegin", md.render(closed));
      stats.parsedChars += closed.length;
      r.frozen = r.cut;
    }
    const open = r.text.slice(r.frozen);
    live.innerHTML = open ? md.render(open) : "";
    stats.parsedChars += open.length;
  }

  window.LokiLive = { create: create, stats: stats };
})();
