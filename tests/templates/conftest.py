"""Fixtures of the template tests: the chat tests' fake engine, fake supervisor, in-process
chat service and NATS client (re-exported from ``tests/chat/conftest.py``), and the recall
service in-process (``tests/compaction/conftest.py``: a compaction archives there)."""

from __future__ import annotations

from tests.chat.conftest import (  # noqa: F401 - fixtures
    chat_runner,
    client,
    fake_engine,
    nc,
    supervisor,
)
from tests.compaction.conftest import recall  # noqa: F401 - fixture
