"""Scheduled tasks: :mod:`.schedule` (cron / interval due times), :mod:`.store` (Redis:
tasks, runs, the claim of each due time), :mod:`.scheduler` (the loop every chat instance
runs, and one run), :mod:`.api` (``loki.chat.tasks``)."""
