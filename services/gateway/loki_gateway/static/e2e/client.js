// The sealed chat client of the PWA (the Python twin: cli/loki_cli/e2e.py). Requests go one at
// a time (their counters must reach the gateway in order), across every tab of the app too (a
// Web Lock around counting and sending); the counter is time-based and kept in localStorage,
// so it only grows. Answers and events must open for exactly this request /
// this place in this stream, or E2EError stops everything. window.E2EClient.
"use strict";

(function () {
  const S = window.E2ESeal;

  class E2ERefused extends Error { // a refusal: sealed (authenticated) or plain (maybe forged)
    constructor(status, error, sealed) {
      super(`${(error && error.message) || "refused"} (${status}${sealed ? "" : ", unsealed"})`);
      this.status = status; this.code = error && error.code; this.sealed = sealed;
    }
  }

  class Client {
    constructor(device, key, apiBase) {
      this.device = device; this.key = key; this.apiBase = apiBase; this.queue = Promise.resolve();
    }

    counter() {
      const last = Number(localStorage.getItem("lokiE2E.counter") || 0);
      const next = Math.max(last + 1, Date.now() * 1000);
      localStorage.setItem("lokiE2E.counter", String(next));
      return next;
    }

    // Runs fn(counter) after the previous request got its answer's headers, in this tab and,
    // holding the lock "lokiE2E.requests" while it counts and sends, in every other tab.
    serial(fn) {
      const turn = () => fn(this.counter());
      const locked = () => (navigator.locks ? navigator.locks.request("lokiE2E.requests", turn) : turn());
      const run = this.queue.then(locked);
      this.queue = run.catch(() => {});
      return run;
    }

    async sealRequest(route, counter, body) {
      return S.seal(this.key, this.device, { counter, body }, S.aad(this.device, route, "request"));
    }

    async request(route, body) {
      let counter = 0;
      const resp = await this.serial(async (c) => {
        counter = c;
        const wire = await this.sealRequest(route, c, body);
        return fetch(`${this.apiBase}/api/e2e/${route}`, {
          method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(wire),
        });
      });
      let obj = null;
      try { obj = await resp.json(); } catch (e) { obj = null; }
      if (!resp.ok && obj && obj.error) throw new E2ERefused(resp.status, obj.error, false);
      const payload = await S.open(this.key, this.device, obj,
        S.aad(this.device, route, "response", counter), `the answer to ${route}`);
      if (payload.status !== resp.status) throw new S.E2EError("the HTTP status differs from the sealed one: stopped");
      if (payload.status >= 400) throw new E2ERefused(payload.status, payload.body.error, true);
      return payload.body;
    }

    // Reads the sealed stream of `conversation` after seq `after`, calling onEvent({seq, name,
    // data}) in order; resolves with the last seq when the stream ends; rejects with E2EError
    // (broken protocol), E2ERefused (refused) or a network error.
    async events(conversation, after, onEvent, signal) {
      const stream = S.b64e(crypto.getRandomValues(new Uint8Array(16)));
      const resp = await this.serial(async (c) => {
        const wire = await this.sealRequest("chat", c, { conversation, after, stream });
        const q = new URLSearchParams({ device: wire.device, nonce: wire.nonce, ct: wire.ct });
        return fetch(`${this.apiBase}/api/e2e/chat?${q}`, {
          headers: { "Last-Event-ID": String(after), Accept: "text/event-stream" }, signal,
        });
      });
      if (!resp.ok) {
        let obj = null;
        try { obj = await resp.json(); } catch (e) { obj = null; }
        throw new E2ERefused(resp.status, (obj && obj.error) || { message: resp.statusText }, false);
      }
      if (!(resp.headers.get("content-type") || "").startsWith("text/event-stream")) {
        throw new S.E2EError("the stream is not an event stream (a downgrade?): stopped");
      }
      let last = after;
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      let fields = {};
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return last;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, "");
          buf = buf.slice(nl + 1);
          if (line) {
            const i = line.indexOf(":");
            if (i > 0) fields[line.slice(0, i)] = line.slice(i + 1).replace(/^ /, "");
            continue;
          }
          const f = fields;
          fields = {};
          if (f.data === undefined) continue;
          const name = f.event || "message";
          if (name === "message" && !/^\d+$/.test(f.id || "")) {
            throw new S.E2EError("an event without its seq id: not the e2e stream, stopped");
          }
          const seq = name === "message" ? Number(f.id) : last;
          let wire = null;
          try { wire = JSON.parse(f.data); } catch (e) { wire = null; }
          const data = await S.open(this.key, this.device, wire,
            S.aad(this.device, "chat", "event", conversation, stream, name, seq, last), `event ${seq}`);
          last = seq;
          onEvent({ seq, name, data });
        }
      }
    }
  }

  window.E2EClient = { Client, E2ERefused };
})();
