"""Loki's chat service: conversations, the turn loop, tools, persistence.

Run with ``python -m loki_chat``; configured by ``LOKI_*`` variables (see
:class:`loki_chat.settings.Settings`). Where each part lives: :mod:`loki_chat.service`'s
docstring, and the module table in docs/architecture.md ("Inside the chat service").
"""
