"""The memory key derivation (scrypt, salt, check value) used by the gateway and checked by
the recall service."""

from __future__ import annotations

import base64
import logging

import pytest

from loki_shared import memkey


def test_derive_check_and_wrong_passphrase() -> None:
    params, key = memkey.new_params("correct horse", n=2**10)
    assert len(key) == 32 and len(params.salt) == 16
    assert params.unlock("correct horse") == key
    assert params.verify(key) and not params.verify(b"\0" * 32) and not params.verify(b"x")
    with pytest.raises(memkey.WrongPassphrase):
        params.unlock("correct horsE")
    again = memkey.KdfParams.from_json(params.to_json())
    assert again == params and again.unlock("correct horse") == key
    assert key not in params.to_json().encode() and base64.b64encode(key).decode() not in (
        params.to_json()
    )
    other, key2 = memkey.new_params("correct horse", n=2**10)
    assert other.salt != params.salt and key2 != key  # a fresh salt each time
    assert memkey.key_id(key) == params.check[:8].hex()


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "not json",
        '{"v": 2, "kdf": "scrypt"}',
        '{"v": 1, "kdf": "scrypt", "salt": "!!", "check": "", "n": 2, "r": 1, "p": 1}',
    ],
)
def test_bad_kdf_record(text: str) -> None:
    with pytest.raises(memkey.BadKdf):
        memkey.KdfParams.from_json(text)


def test_unused_logger_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        memkey.new_params("pw", n=2**10)
    assert caplog.records == []
