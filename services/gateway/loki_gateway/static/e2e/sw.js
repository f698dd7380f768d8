// The e2e PWA's service worker (issue 45): every asset is cached when it installs, and served
// from that cache from then on, so at run time no script or page comes through the relay;
// only the sealed /api/e2e/ requests go to the network. A new version of the app is a new
// CACHE name (the old cache is dropped when the new worker activates).
// Updates: the browser fetches sw.js from the network to look for one (a relay can answer
// that). This worker never skips waiting, so a new one only takes over once every tab of the
// app is closed, and the open page (app.js) stops and says so as soon as one is found.
"use strict";

const CACHE = "loki-e2e-v2";
const ASSETS = ["./", "index.html", "e2e.css", "seal.js", "keystore.js", "client.js", "app.js", "manifest.json", "icon.svg"];

self.addEventListener("install", (ev) => {
  ev.waitUntil(caches.open(CACHE).then((c) => c.addAll(ASSETS)));
});

self.addEventListener("activate", (ev) => {
  ev.waitUntil(
    caches.keys()
      .then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))
      .then(() => self.clients.claim()),
  );
});

self.addEventListener("fetch", (ev) => {
  const url = new URL(ev.request.url);
  if (ev.request.method !== "GET" || url.pathname.includes("/api/")) return; // sealed: network
  ev.respondWith(caches.match(ev.request, { ignoreSearch: true }).then((hit) => hit || fetch(ev.request)));
});
