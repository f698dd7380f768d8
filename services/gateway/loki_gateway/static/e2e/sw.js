// The e2e PWA's service worker (issue 45): every asset is cached when it installs, and served
// from that cache from then on, so at run time no script or page comes through the relay;
// only the sealed /api/e2e/ requests go to the network. A new version of the app is a new
// CACHE name (the old cache is dropped when the new worker activates).
"use strict";

const CACHE = "loki-e2e-v1";
const ASSETS = ["./", "index.html", "e2e.css", "seal.js", "client.js", "app.js", "manifest.json", "icon.svg"];

self.addEventListener("install", (ev) => {
  ev.waitUntil(caches.open(CACHE).then((c) => c.addAll(ASSETS)).then(() => self.skipWaiting()));
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
