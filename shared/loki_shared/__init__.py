"""Loki's shared package.

Every service imports this package and nothing from the other services. It holds:

- :mod:`loki_shared.settings` — the pydantic-settings base every service's Settings extends;
- :mod:`loki_shared.subjects` — every NATS subject, queue group and JetStream stream name;
- :mod:`loki_shared.messages` — one pydantic model per message carried on those subjects;
- :mod:`loki_shared.sealing` — AES-256-GCM sealing of blobs stored in Redis;
- :mod:`loki_shared.logsetup` — logging set-up;
- :mod:`loki_shared.servers` — locating and starting NATS, Redis and llama-server binaries
  (used by the launcher and by the test fixtures);
- :mod:`loki_shared.sse` — the one decoder of llama-server / OpenAI streams;
- :mod:`loki_shared.tool_calls` — the one assembler of streamed tool calls;
- :mod:`loki_shared.lease` — the one engine-lease client (``async with lease(...)``).
"""

__version__ = "0.1.0"
