// The envelope of loki_shared/e2e_envelope.py in WebCrypto (AES-256-GCM): seal, open, the
// associated data (a JSON array, the same bytes as Python's), base64url and the pairing code.
// window.E2ESeal.
"use strict";

(function () {
  const enc = new TextEncoder();
  const dec = new TextDecoder("utf-8", { fatal: true });

  class E2EError extends Error {} // the protocol broke: unsealed, tampered, replayed, moved

  function b64e(bytes) {
    let bin = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function b64d(text) {
    const s = String(text).replace(/-/g, "+").replace(/_/g, "/");
    const bin = atob(s + "===".slice((s.length + 3) % 4));
    return Uint8Array.from(bin, (c) => c.charCodeAt(0));
  }

  const aad = (device, route, direction, ...context) =>
    enc.encode(JSON.stringify(["loki-e2e", 1, device, route, direction, ...context]));

  async function seal(key, device, payload, associated) {
    const nonce = crypto.getRandomValues(new Uint8Array(12)); // fresh random 96-bit nonce
    const ct = await crypto.subtle.encrypt(
      { name: "AES-GCM", iv: nonce, additionalData: associated }, key, enc.encode(JSON.stringify(payload)));
    return { v: 1, device, nonce: b64e(nonce), ct: b64e(new Uint8Array(ct)) };
  }

  // The payload of the envelope `wire`, or E2EError: not an envelope, or it does not open
  // with `associated` (tampered, replayed, moved to another place).
  async function open(key, device, wire, associated, what) {
    if (!wire || typeof wire !== "object" || wire.v !== 1 || typeof wire.ct !== "string"
        || typeof wire.nonce !== "string" || wire.device !== device) {
      throw new E2EError(`${what} is not sealed (a downgrade, or not Loki's e2e answer): stopped`);
    }
    let plain;
    try {
      plain = await crypto.subtle.decrypt(
        { name: "AES-GCM", iv: b64d(wire.nonce), additionalData: associated }, key, b64d(wire.ct));
    } catch (e) {
      throw new E2EError(`${what} does not open in its place (tampered, replayed, reordered or moved): stopped`);
    }
    return JSON.parse(dec.decode(plain));
  }

  // {device, key (raw bytes), base} of a pairing code, or an Error saying to copy it again.
  function readCode(code) {
    const text = String(code || "").replace(/\s+/g, ""); // wrapped or spaced when pasted
    const prefix = "loki-e2e1:";
    if (!text.startsWith(prefix)) throw new Error(`a pairing code starts with "${prefix}"`);
    try {
      const obj = JSON.parse(dec.decode(b64d(text.slice(prefix.length))));
      const key = b64d(obj.k);
      if (typeof obj.d !== "string" || key.length !== 32) throw new Error("bad");
      return { device: obj.d, key, base: obj.b || "" };
    } catch (e) {
      throw new Error("the pairing code is damaged: copy it again");
    }
  }

  const importKey = (raw) => crypto.subtle.importKey("raw", raw, "AES-GCM", false, ["encrypt", "decrypt"]);

  window.E2ESeal = { E2EError, b64e, b64d, aad, seal, open, readCode, importKey };
})();
