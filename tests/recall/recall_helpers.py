"""Helpers of the recall tests (imported by the tests and by conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import nats
from pydantic import BaseModel

from loki_recall.settings import Settings

R = TypeVar("R", bound=BaseModel)


def recall_settings(nats_url: str, redis_url: str, home: Path) -> Settings:
    return Settings(
        nats_url=nats_url,
        redis_url=redis_url,
        home=home,
        secret_key="test-secret-key-0123456789",
        recall_memory_poll_s=0.5,
    )


class Client:
    """A nats-py connection sending pydantic requests and decoding typed replies."""

    def __init__(self, nc: nats.NATS) -> None:
        self.nc = nc

    async def ask(
        self, subject: str, message: BaseModel, reply_type: type[R], timeout: float = 10.0
    ) -> R:
        msg = await self.nc.request(subject, message.model_dump_json().encode(), timeout=timeout)
        return reply_type.model_validate_json(msg.data)
