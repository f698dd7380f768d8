"""Attachments through the real gateway process (real Redis, the fake chat and supervisor
peers on NATS): upload by content type, size limit, sealed storage with a 24 h expiry, the
thumbnail route, text inlined and images as data URLs on send, vision refused clearly, the
memory key's lock."""

from __future__ import annotations

import base64
import time

import redis

from loki_gateway.attachments import TTL_S, redis_key
from loki_shared import memkey
from tests.fakes.media import pdf, png


def _upload(c, name: str, data: bytes, mime: str = "application/octet-stream"):
    return c.post("/api/chat/upload", files={"file": (name, data, mime)})


def _last_send(peers, n: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while len(peers.sends) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(peers.sends) >= n
    return peers.sends[n - 1]


def test_text_pdf_and_image_attachments(gateway, peers, redis_url) -> None:
    peers.supervisor.vision = False
    with gateway.client() as c:
        # the type comes from the content: a text file named .png is text
        text = _upload(c, "notes.png", b"line one\n```\ncode\n```\n", "image/png")
        assert text.status_code == 201, text.text
        t = text.json()
        assert t["kind"] == "text" and t["mime"] == "text/plain" and t["name"] == "notes.png"
        doc = _upload(c, "../../etc/report.pdf", pdf("Quarterly figures are up"))
        assert doc.status_code == 201, doc.text
        d = doc.json()
        assert d["kind"] == "text" and d["mime"] == "application/pdf"
        assert d["name"] == "report.pdf"  # the path part of the name is dropped
        image = _upload(c, "red.bin", png(), "text/plain")
        assert image.status_code == 201, image.text
        i = image.json()
        assert i["kind"] == "image" and i["mime"] == "image/png"

        # stored sealed (the plaintext is nowhere in Redis) and pruned 24 h after last use
        r = redis.Redis.from_url(redis_url)
        raw = r.get(redis_key(t["id"]))
        assert raw is not None and b"line one" not in raw
        assert TTL_S - 60 < r.ttl(redis_key(t["id"])) <= TTL_S
        r.expire(redis_key(i["id"]), 100)
        thumb = c.get(f"/api/chat/attachment/{i['id']}")
        assert thumb.status_code == 200 and thumb.content == png()
        assert thumb.headers["content-type"] == "image/png"
        assert r.ttl(redis_key(i["id"])) > TTL_S - 60  # a use starts the 24 h again
        gone = c.get("/api/chat/attachment/" + "0" * 32)
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "attachment_not_found"

        # text files inlined as fenced blocks with their names, after the message
        before = len(peers.sends)
        sent = c.post(
            "/api/chat/send", json={"content": "Read these", "attachments": [t["id"], d["id"]]}
        )
        assert sent.status_code == 202, sent.text
        req = _last_send(peers, before + 1)
        assert req.images == []
        assert req.content.startswith("Read these\n\nAttached file `notes.png`:\n````\nline one")
        assert "Attached file `report.pdf`:\n```\nQuarterly figures are up\n```" in req.content

        # an image without vision: refused, saying why, nothing sent
        before = len(peers.sends)
        refused = c.post("/api/chat/send", json={"content": "Look", "attachments": [i["id"]]})
        assert refused.status_code == 400
        err = refused.json()["error"]
        assert err["code"] == "vision_unavailable" and "red.bin" in err["message"]
        assert err["type"] == "invalid_request_error"
        time.sleep(0.2)
        assert len(peers.sends) == before

        # with vision: the image goes as a data URL beside the text
        peers.supervisor.vision = True
        ok = c.post("/api/chat/send", json={"attachments": [i["id"]]})
        assert ok.status_code == 202, ok.text
        req = _last_send(peers, before + 1)
        assert req.content == ""
        assert [(x.id, x.name) for x in req.images] == [(i["id"], "red.bin")]
        assert req.images[0].url == "data:image/png;base64," + base64.b64encode(png()).decode()

        # an unknown attachment id on send: 404, nothing sent
        missing = c.post("/api/chat/send", json={"content": "x", "attachments": ["f" * 32]})
        assert missing.status_code == 404
        empty = c.post("/api/chat/send", json={"content": ""})
        assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_message"
    peers.supervisor.vision = False


def test_refused_uploads(gateway_factory, peers) -> None:
    gw = gateway_factory(LOKI_UPLOAD_MAX_MB="0.001")  # 1048 bytes
    with gw.client() as c:
        big = _upload(c, "big.txt", b"a" * 2000, "text/plain")
        assert big.status_code == 413
        err = big.json()["error"]
        assert err["code"] == "file_too_large" and "LOKI_UPLOAD_MAX_MB" in err["message"]
        assert err["type"] == "invalid_request_error"
        zipped = _upload(c, "notes.txt", b"PK\x03\x04" + b"\x00" * 60, "text/plain")
        assert zipped.status_code == 415
        assert "application/zip" in zipped.json()["error"]["message"]
        binary = _upload(c, "a.txt", bytes(range(256)), "text/plain")
        assert binary.status_code == 415
        assert binary.json()["error"]["code"] == "unsupported_file_type"
        scan = _upload(c, "scan.pdf", pdf(""), "application/pdf")
        assert scan.status_code == 415 and "images" in scan.json()["error"]["message"]


def _broken_png() -> bytes:
    good = bytearray(png(64, 64))
    start = good.index(b"IDAT") + 4
    good[start : start + 12] = b"\x00" * 12  # the compressed pixels no longer inflate
    return bytes(good)


def test_every_parser_failure_is_a_4xx_naming_the_file(gateway, peers, redis_url) -> None:
    """Issue 38 §7: whatever parser fails on an upload (pypdf on a filter it cannot decode or
    a broken file, the text decoder, Pillow on a broken image) the answer is 415 or 422 in
    OpenAI's shape naming the file, and nothing is stored."""
    r = redis.Redis.from_url(redis_url)
    before = set(r.scan_iter("loki:chat:att:*"))
    cases = [
        ("jbig2.pdf", pdf("Scanned page", filter="JBIG2Decode"), 422),
        ("unknown-filter.pdf", pdf("Text", filter="NoSuchDecode"), 422),
        ("broken-flate.pdf", pdf("Text", filter="FlateDecode"), 415),  # no text comes out
        ("cut.pdf", pdf("Cut short")[:300], 422),
        ("broken.png", _broken_png(), 422),
        ("cut.png", png(64, 64)[:60], 422),
        ("cut.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 40, 422),
        ("junk.gif", b"GIF89a" + b"\xff" * 40, 422),
        ("junk.webp", b"RIFF\x20\x00\x00\x00WEBPVP8 " + b"\x00" * 30, 422),
        ("odd.txt", b"\xff\xfeh\x00i\x00\x00", 422),  # UTF-16 with a byte cut off
        ("bad-utf32.txt", b"\xff\xfe\x00\x00" + b"\xff\xff\xff\xff", 422),
        ("latin1.txt", "café crème".encode("latin-1"), 415),
        ("nul.txt", b"abc\x00def", 415),
    ]
    with gateway.client() as c:
        for name, data, status in cases:
            resp = _upload(c, name, data)
            assert resp.status_code == status, (name, resp.status_code, resp.text)
            error = resp.json()["error"]
            assert {"message", "type", "code"} <= set(error), error
            assert error["type"] == "invalid_request_error"
            assert error["code"] == (
                "unreadable_file" if status == 422 else "unsupported_file_type"
            )
            assert repr(name) in error["message"], error
        assert set(r.scan_iter("loki:chat:att:*")) == before  # nothing stored
        # text with a byte order mark is read in its encoding and kept as UTF-8
        for name, data in (
            ("utf16.txt", "Здоровье 日記".encode("utf-16")),
            ("utf8-bom.txt", "\ufeffZdravo".encode()),
        ):
            ok = _upload(c, name, data)
            assert ok.status_code == 201, ok.text
            back = c.get(f"/api/chat/attachment/{ok.json()['id']}").content.decode("utf-8")
            assert back in ("Здоровье 日記", "Zdravo")


def test_an_attachment_belongs_to_the_conversation_it_was_sent_in(gateway, peers) -> None:
    """Advisory (issue 38): an attachment id from one conversation cannot be read through
    another: neither sent again in another conversation (nor in a new one) nor read as
    another conversation's; its own conversation keeps using it."""
    peers.supervisor.vision = True
    with gateway.client() as c:
        att = _upload(c, "plan.txt", b"the secret plan").json()["id"]
        first = c.post("/api/chat/send", json={"content": "read this", "attachments": [att]})
        assert first.status_code == 202, first.text
        conv_a = first.json()["conversation"]
        n = len(peers.sends)
        assert "the secret plan" in peers.sends[-1].content
        other = c.post("/api/chat/send", json={"content": "hi"}).json()["conversation"]
        for body in (
            {"content": "and this?", "attachments": [att], "conversation": other},
            {"content": "and this?", "attachments": [att]},  # a new conversation
        ):
            refused = c.post("/api/chat/send", json=body)
            assert refused.status_code == 404, refused.text
            error = refused.json()["error"]
            assert error["code"] == "attachment_not_found"
            assert "does not exist in this conversation" in error["message"]
        assert len(peers.sends) == n + 1  # only the plain "hi" went on
        again = c.post(
            "/api/chat/send",
            json={"content": "once more", "attachments": [att], "conversation": conv_a},
        )
        assert again.status_code == 202
        # read as another conversation's: 404; as its own: the content
        read = c.get(f"/api/chat/attachment/{att}", params={"conversation": other})
        assert read.status_code == 404
        own = c.get(f"/api/chat/attachment/{att}", params={"conversation": conv_a})
        assert own.content == b"the secret plan"
        # an image sent into an existing conversation is bound to it at once
        img = _upload(c, "red.png", png()).json()["id"]
        sent = c.post(
            "/api/chat/send", json={"content": "see", "attachments": [img], "conversation": other}
        )
        assert sent.status_code == 202
        stolen = c.post(
            "/api/chat/send",
            json={"content": "see", "attachments": [img], "conversation": conv_a},
        )
        assert stolen.status_code == 404


def test_behind_the_key(gateway_factory, peers) -> None:
    gw = gateway_factory(key="attach-key")
    with gw.client() as c:
        up = _upload(c, "a.txt", b"hello")
        assert up.status_code == 201
        att = up.json()["id"]
    import httpx

    anon = httpx.post(f"{gw.url}/api/chat/upload", files={"file": ("a.txt", b"hello")})
    assert anon.status_code == 401
    assert httpx.get(f"{gw.url}/api/chat/attachment/{att}").status_code == 401


def test_memory_key_seals_attachments(gateway_factory, peers, redis_url) -> None:
    gw = gateway_factory()
    r = redis.Redis.from_url(redis_url)
    try:
        with gw.client() as c:
            assert c.post("/api/memory/unlock", json={"passphrase": "pw-att"}).status_code == 200
            up = _upload(c, "secret.txt", b"sealed twice")
            assert up.status_code == 201
            att = up.json()["id"]
            assert c.get(f"/api/chat/attachment/{att}").content == b"sealed twice"
            assert c.post("/api/memory/lock").json() == {"state": "locked"}
            locked = c.get(f"/api/chat/attachment/{att}")
            assert locked.status_code == 423
            assert locked.json()["error"]["code"] == "memory_locked"
            refused = _upload(c, "other.txt", b"not while locked")
            assert refused.status_code == 423 and "unlock" in refused.json()["error"]["message"]
            assert c.post("/api/memory/unlock", json={"passphrase": "pw-att"}).status_code == 200
            assert c.get(f"/api/chat/attachment/{att}").content == b"sealed twice"
    finally:
        r.delete(memkey.KDF_REDIS_KEY)
