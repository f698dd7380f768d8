// The Code panel's acceptance criteria (issue 43): the conversation's criteria with their
// state (a badge: pending, met, failed; the detail — the command, its exit status and last
// output lines, or the verifier's reason — behind each one's toggle), "Check now" (POST
// /api/chat/criteria/check: the commands run in the sandbox now, no corrective round) and an
// editor (PUT /api/chat/criteria: the list replaced, each one pending again). The model sets
// them too (its criteria tool): the panel redraws on the display event `criteria`.
// Uses window.LokiApi (app.js), window.LokiDialog (dialog.js); window.LokiCriteria, driven by
// code-panel.js.
"use strict";

window.LokiCriteria = (function () {
  const $ = (id) => document.getElementById(id);
  let criteria = [];
  let conversation = () => null;
  let onState = () => {};
  const openIds = new Set(); // the criteria whose detail is shown, kept across redraws

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const status = (text, isError) => LokiDialog.status("criteria-status", text, isError);

  function summary(list) {
    const n = { pending: 0, met: 0, failed: 0 };
    for (const c of list) n[c.state] = (n[c.state] || 0) + 1;
    return ["met", "failed", "pending"].filter((k) => n[k]).map((k) => n[k] + " " + k).join(", ");
  }

  // Draws `list` (CodeState.criteria); the same list again changes nothing (the focus stays).
  let drawn = null;
  function render(list) {
    criteria = list || [];
    const sig = JSON.stringify(criteria);
    if (sig === drawn) return;
    drawn = sig;
    const ul = $("criteria-list");
    ul.textContent = "";
    if (!criteria.length) {
      LokiDialog.emptyRow(ul, "No criteria yet: set them here, or the model sets them with its criteria tool.");
    }
    for (const c of criteria) {
      const li = el("li", "criterion");
      li.dataset.id = c.id;
      li.dataset.state = c.state;
      const box = el("details");
      box.open = openIds.has(c.id);
      box.ontoggle = () => { if (box.open) openIds.add(c.id); else openIds.delete(c.id); };
      const s = el("summary");
      s.append(el("span", "pill crit-" + c.state, c.state), " ", el("span", "crit-text", c.text));
      box.append(s);
      if (c.command) {
        const p = el("p", "crit-command", "Command: ");
        p.append(el("code", null, c.command));
        box.append(p);
      } else {
        box.append(el("p", "hint", "No command: the verifier judges it against the workspace."));
      }
      if (c.detail) box.append(el("pre", "crit-detail", c.detail));
      box.append(el("p", "hint", c.checked ? "Checked " + new Date(c.checked * 1000).toLocaleTimeString() : "Not checked yet."));
      li.append(box);
      ul.append(li);
    }
    $("criteria-check").disabled = !criteria.length;
  }

  async function check() {
    const id = conversation();
    if (!id) return;
    const b = $("criteria-check");
    b.setAttribute("aria-busy", "true");
    b.disabled = true;
    status("Checking… (the commands run in the sandbox)");
    try {
      const st = await LokiApi.apiJSON("/api/chat/criteria/check", { method: "POST", json: { conversation: id } });
      onState(st);
      status("Checked: " + (summary(st.criteria || []) || "none"));
    } catch (e) {
      status("Not checked: " + e.message, true);
    } finally {
      b.removeAttribute("aria-busy");
      b.disabled = !criteria.length;
    }
  }

  // ---- the editor ------------------------------------------------------------------------
  function row(c) {
    const ol = $("criteria-rows");
    const li = el("li", "criterion-row");
    const n = ol.children.length + 1;
    const text = el("input");
    text.name = "text"; text.maxLength = 2000; text.value = c.text || "";
    text.placeholder = "the tests pass";
    const command = el("input");
    command.name = "command"; command.maxLength = 2000; command.value = c.command || "";
    command.placeholder = "pytest -q (optional)";
    const l1 = el("label", null, "Criterion " + n + " ");
    l1.append(text);
    const l2 = el("label", null, "Command (optional) ");
    l2.append(command);
    const del = LokiDialog.button("Remove", () => { li.remove(); renumber(); });
    del.setAttribute("aria-label", "Remove criterion " + n);
    li.append(l1, l2, del);
    ol.append(li);
    return text;
  }

  function renumber() {
    Array.from($("criteria-rows").children).forEach((li, i) => {
      li.querySelector("label").firstChild.textContent = "Criterion " + (i + 1) + " ";
      li.querySelector("button").setAttribute("aria-label", "Remove criterion " + (i + 1));
    });
  }

  function edit() {
    const form = $("criteria-form");
    $("criteria-rows").textContent = "";
    LokiDialog.error("criteria-error", "");
    for (const c of criteria) row(c);
    const first = row({});
    form.hidden = false;
    $("criteria-edit").hidden = true;
    (criteria.length ? $("criteria-rows").querySelector("input") : first).focus();
  }

  function closeEditor() {
    $("criteria-form").hidden = true;
    $("criteria-edit").hidden = false;
    $("criteria-edit").focus();
  }

  async function save(ev) {
    ev.preventDefault();
    const id = conversation();
    if (!id) return;
    const list = [];
    for (const li of $("criteria-rows").children) {
      const text = li.querySelector("input[name=text]").value.trim();
      const command = li.querySelector("input[name=command]").value.trim();
      if (text) list.push(command ? { text, command } : { text });
    }
    try {
      const st = await LokiApi.apiJSON("/api/chat/criteria", { method: "PUT", json: { conversation: id, criteria: list } });
      onState(st);
      closeEditor();
      status(list.length ? "Criteria saved: " + list.length + ", all pending." : "Criteria cleared.");
    } catch (e) {
      LokiDialog.error("criteria-error", e);
    }
  }

  function setup(getConversation, stateChanged) {
    conversation = getConversation;
    onState = stateChanged;
    $("criteria-check").onclick = check;
    $("criteria-edit").onclick = edit;
    $("criteria-add").onclick = () => row({}).focus();
    $("criteria-cancel").onclick = closeEditor;
    $("criteria-form").onsubmit = save; // rows left empty are not criteria
  }

  // Another conversation: no editor open, no status left over.
  function reset() {
    $("criteria-form").hidden = true;
    $("criteria-edit").hidden = false;
    status("");
    openIds.clear();
    drawn = null;
  }

  return { render, setup, reset };
})();
