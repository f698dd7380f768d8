"""Loki's memory service: projects, their memory pages (indexed by code in ``MEMORY.md``) and
their trackers, served on ``loki.projects.*`` (see :mod:`loki_shared.messages.projects`).

Run with ``python -m loki_memory`` (configured by ``LOKI_*`` variables, see
:mod:`loki_memory.settings`).
"""
