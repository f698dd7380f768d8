"""Loki's chat service: conversations, the turn loop, tools, persistence.

Run with ``python -m loki_chat``; configured by ``LOKI_*`` variables (see
:class:`loki_chat.settings.Settings`).
"""
