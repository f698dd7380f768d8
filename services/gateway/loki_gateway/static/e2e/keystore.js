// The device key of the e2e PWA (issue 45), kept as a non-extractable WebCrypto key in
// IndexedDB: this page can seal and open with it, but no script, a replaced copy of the app
// included, can read its bytes out of the browser. window.E2EKeys: save(raw bytes) ->
// CryptoKey, load() -> CryptoKey or null, forget().
"use strict";

(function () {
  const DB = "lokiE2E";
  const STORE = "keys";
  const ID = "device";

  function open() {
    return new Promise((resolve, reject) => {
      const req = indexedDB.open(DB, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(STORE);
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  // fn(objectStore) -> IDBRequest; resolves with its result once the transaction commits.
  async function run(mode, fn) {
    const db = await open();
    try {
      return await new Promise((resolve, reject) => {
        const tx = db.transaction(STORE, mode);
        const req = fn(tx.objectStore(STORE));
        tx.oncomplete = () => resolve(req.result);
        tx.onerror = tx.onabort = () => reject(tx.error || new Error("the key store failed"));
      });
    } finally {
      db.close();
    }
  }

  async function save(raw) {
    const key = await crypto.subtle.importKey("raw", raw, "AES-GCM", false, ["encrypt", "decrypt"]);
    await run("readwrite", (s) => s.put(key, ID));
    return key;
  }

  const load = async () => (await run("readonly", (s) => s.get(ID))) || null;
  const forget = () => run("readwrite", (s) => s.delete(ID));

  window.E2EKeys = { save, load, forget };
})();
