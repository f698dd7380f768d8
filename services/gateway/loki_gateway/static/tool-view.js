// The code tools' calls and results drawn for a person (issue 43, Code mode), in place of the
// generic "⚙ name {json}" bubble of chat-messages.js:
// - a call: `run` shows its command line ("⚙ run: pytest -q", then "$ pytest -q"), `git` its
//   op (and commit message), the file tools (read, write, edit, list, glob, grep, preview)
//   their path or pattern;
// - a result of `run` or `git`: the exit code (a badge: green 0, red otherwise), why the
//   sandbox killed it (timeout, output, memory, processes), the duration, the command again,
//   and the output in monospace: whole when short, else its last lines with the whole output
//   behind a "Whole output" toggle. The figures come from the event's `loki.run` when the chat
//   service sends them ({command, exit_code, killed, output, truncated, duration_s}), else
//   from the result text's first line ("exit code: 0 | duration: 1.2 s | output: 10 bytes").
// chat-messages.js calls call() on every update of a call and result() for each result (a
// false answer: drawn the generic way). window.LokiToolView.
"use strict";

window.LokiToolView = (function () {
  const SHORT_LINES = 15;
  const SHORT_CHARS = 1500;
  const TAIL_LINES = 10;
  const SUBJECT = { read: "path", write: "path", edit: "path", list: "path", glob: "pattern",
                    grep: "pattern", preview: "path", criteria: "action" };

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function parseArgs(raw) {
    try { const a = JSON.parse(raw || "{}"); return a && typeof a === "object" ? a : null; }
    catch (e) { return null; } // still streaming
  }

  const oneLine = (s, n) => { s = String(s).replace(/\s+/g, " ").trim(); return s.length > n ? s.slice(0, n - 1) + "…" : s; };

  function gitLine(args) {
    let line = "git " + (args.op || "");
    if (args.paths && args.paths.length) line += " -- " + args.paths.join(" ");
    if (args.message) line += " -m " + JSON.stringify(args.message);
    return line;
  }

  // A call's bubble (chat-messages.js: {name, args, el, s, pre}) drawn for its tool; true when
  // this tool is one of the code tools.
  function call(c) {
    c.el._call = c; // its result finds the command here (tool_call_id)
    const args = parseArgs(c.args);
    if (!args) return false;
    if (c.name === "run" && typeof args.command === "string") {
      c.el.classList.add("code-call");
      c.s.textContent = "⚙ run: " + oneLine(args.command, 80);
      c.pre.className = "cmd";
      c.pre.textContent = "$ " + args.command + (args.timeout_s ? "\n(time limit " + args.timeout_s + " s)" : "");
      return true;
    }
    if (c.name === "git" && typeof args.op === "string") {
      c.el.classList.add("code-call");
      c.s.textContent = "⚙ " + oneLine(gitLine(args), 80);
      c.pre.className = "cmd";
      c.pre.textContent = gitLine(args);
      return true;
    }
    const key = SUBJECT[c.name];
    if (key && typeof args[key] === "string") {
      c.s.textContent = "⚙ " + c.name + " " + oneLine(args[key], 70);
      return true;
    }
    return false;
  }

  // The figures of a run/git result: from loki.run, else the text's status line; null when the
  // text is not a command's result (a failure to run: drawn as plain text).
  function parse(loki, text) {
    const r = loki && loki.run;
    if (r && typeof r === "object") {
      return { exit: r.exit_code == null ? null : r.exit_code, killed: r.killed || "",
               duration: r.duration_s, output: r.output || "", truncated: !!r.truncated,
               command: r.command || null };
    }
    const nl = text.indexOf("\n");
    const head = nl < 0 ? text : text.slice(0, nl);
    const rest = nl < 0 ? "" : text.slice(nl + 1);
    const m = head.match(/^(?:exit code: (-?\d+|None)|killed: (\w+)[^|]*)(?:\s*\|\s*duration: ([\d.]+) s)?/);
    if (!m) return null;
    return { exit: m[1] != null && m[1] !== "None" ? Number(m[1]) : null, killed: m[2] || "",
             duration: m[3] != null ? Number(m[3]) : null,
             output: rest.trim() === "(no output)" ? "" : rest,
             truncated: /head and tail/.test(head), command: null };
  }

  function callOf(root, id) {
    if (!id || !root) return null;
    let found = null;
    for (const node of root.querySelectorAll("[data-call-id]")) if (node.dataset.callId === id) found = node;
    return found && found._call ? found._call : null;
  }

  function outputBox(parent, output) {
    if (!output) { parent.append(el("p", "hint run-none", "(no output)")); return; }
    const lines = output.replace(/\n$/, "").split("\n");
    if (lines.length <= SHORT_LINES && output.length <= SHORT_CHARS) {
      parent.append(el("pre", "run-output", output.replace(/\n$/, "")));
      return;
    }
    const tail = el("pre", "run-output", lines.slice(-TAIL_LINES).join("\n"));
    const whole = el("details", "run-whole");
    whole.append(el("summary", null, "Whole output (" + lines.length + " lines)"));
    const pre = el("pre", "run-output whole");
    pre.tabIndex = 0; // it scrolls: reachable by keyboard
    pre.setAttribute("role", "region");
    pre.setAttribute("aria-label", "Whole output");
    pre.textContent = output;
    whole.append(pre);
    parent.append(el("p", "hint", "Last " + TAIL_LINES + " of " + lines.length + " lines:"), tail, whole);
  }

  // A result bubble `bubble` (a fresh div.msg.tool) drawn for a run or git result; true when
  // drawn. `root`: where the call's bubble is.
  function result(bubble, delta, loki, root) {
    if (delta.name !== "run" && delta.name !== "git") return false;
    const text = String(delta.content == null ? "" : delta.content);
    const r = parse(loki, text);
    if (!r) return false;
    const c = callOf(root, delta.tool_call_id);
    const args = c ? parseArgs(c.args) || {} : {};
    const command = r.command || (delta.name === "run" ? args.command : args.op ? gitLine(args) : null);
    bubble.classList.add("run-result");
    const head = el("div", "run-head");
    head.append(el("span", null, "↳ " + delta.name));
    if (r.killed) head.append(el("span", "pill exit-killed", "killed: " + r.killed));
    else if (r.exit != null) head.append(el("span", "pill " + (r.exit === 0 ? "exit-ok" : "exit-fail"), "exit " + r.exit));
    if (r.duration != null) head.append(el("span", "hint", r.duration.toFixed(1) + " s"));
    if (r.truncated) head.append(el("span", "hint", "output cut by the sandbox (head and tail kept)"));
    bubble.append(head);
    if (command) {
      const cmd = el("pre", "cmd");
      cmd.textContent = (delta.name === "run" ? "$ " : "") + command;
      bubble.append(cmd);
    }
    outputBox(bubble, r.output);
    return true;
  }

  return { call, result, parse };
})();
