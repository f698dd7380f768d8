"""The e2e envelope's rules (loki_shared.e2e_envelope), pure: what opens, what does not."""

from __future__ import annotations

import json
import os

import pytest

from loki_shared import e2e_envelope as env

KEY = os.urandom(32)


def _aad(*context):
    return env.aad("dev_0123456789abcdef", "chat", "event", *context)


def test_round_trip_and_fresh_nonces():
    payload = {"text": "wörld 🌍", "n": [1, 2]}
    first = env.seal(KEY, "dev_0123456789abcdef", payload, _aad("c", "s", "message", 2, 1))
    second = env.seal(KEY, "dev_0123456789abcdef", payload, _aad("c", "s", "message", 2, 1))
    assert set(first) == {"v", "device", "nonce", "ct"} and first["v"] == 1
    assert first["nonce"] != second["nonce"] and first["ct"] != second["ct"]
    assert len(env.b64d(first["nonce"])) == 12
    opened = env.open_payload(KEY, env.parse(first), _aad("c", "s", "message", 2, 1))
    assert opened == payload
    assert "wörld".encode() not in json.dumps(first).encode()


@pytest.mark.parametrize(
    "other",
    [
        ("c2", "s", "message", 2, 1),  # another conversation
        ("c", "s2", "message", 2, 1),  # another stream
        ("c", "s", "reconnect", 2, 1),  # another event name
        ("c", "s", "message", 3, 1),  # another seq
        ("c", "s", "message", 2, 0),  # another previous seq (a dropped or repeated event)
    ],
)
def test_associated_data_binds_the_place(other):
    sealed = env.seal(KEY, "dev_0123456789abcdef", {"a": 1}, _aad("c", "s", "message", 2, 1))
    with pytest.raises(env.EnvelopeError) as err:
        env.open_payload(KEY, env.parse(sealed), _aad(*other))
    assert not err.value.malformed


def test_device_route_direction_and_key_are_bound():
    base = env.aad("dev_a", "send", "request")
    sealed = env.seal(KEY, "dev_a", {"a": 1}, base)
    for wrong in (
        env.aad("dev_b", "send", "request"),
        env.aad("dev_a", "control", "request"),
        env.aad("dev_a", "send", "response"),
    ):
        with pytest.raises(env.EnvelopeError):
            env.open_payload(KEY, env.parse(sealed), wrong)
    with pytest.raises(env.EnvelopeError):
        env.open_payload(os.urandom(32), env.parse(sealed), base)
    ct = bytearray(env.b64d(sealed["ct"]))
    ct[3] ^= 1
    with pytest.raises(env.EnvelopeError):
        env.open_payload(KEY, env.parse({**sealed, "ct": env.b64e(bytes(ct))}), base)


@pytest.mark.parametrize(
    "wire",
    [
        None,
        {"error": {"message": "plain"}},
        {"v": 2, "device": "d", "nonce": "AAAAAAAAAAAAAAAA", "ct": "A" * 24},
        {"v": 1, "device": "d", "nonce": "short", "ct": "A" * 24},
        {"v": 1, "device": "d", "nonce": "AAAAAAAAAAAAAAAA", "ct": "AA"},
        {"v": 1, "device": 5, "nonce": "AAAAAAAAAAAAAAAA", "ct": "A" * 24},
    ],
)
def test_not_an_envelope_is_malformed(wire):
    with pytest.raises(env.EnvelopeError) as err:
        env.parse(wire)
    assert err.value.malformed


def test_aad_is_unambiguous_json():
    assert env.aad("d", "chat", "event", "a|b", 1) != env.aad("d", "chat", "event", "a", "b", 1)
    with pytest.raises(ValueError):
        env.aad("d", "chat", "sideways")


def test_pairing_code_round_trip_and_damage():
    code = env.pairing_code("dev_0123456789abcdef", KEY, "/loki")
    assert env.read_code(code) == ("dev_0123456789abcdef", KEY, "/loki")
    with pytest.raises(ValueError, match="starts with"):
        env.read_code("hello")
    with pytest.raises(ValueError, match="damaged"):
        env.read_code(code[:-6])
