"""One pydantic model per message carried over NATS, grouped by the owning domain.

- :mod:`.base` — the common base class and the error shape of replies;
- :mod:`.chat` — conversations, turns, display events (``loki.chat.*``);
- :mod:`.mcp` — the person's MCP servers (``loki.chat.mcp``);
- :mod:`.recall` — the archive and its tools (``loki.recall.*``);
- :mod:`.memory` — the user's memory key (``loki.memory.*``);
- :mod:`.projects` — projects, memory pages, trackers (``loki.projects.*``);
- :mod:`.engine` — engine info, state, leases, presets (``loki.engine.*``);
- :mod:`.perf` — completion records and summaries (``loki.perf.*``);
- :mod:`.events` — audit events (``loki.events.*``).
"""
