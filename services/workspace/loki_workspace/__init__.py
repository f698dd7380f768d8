"""Loki's workspace service: each project's workspace (a git repository), the file tools over
it and the commands run in it under a bubblewrap sandbox, served on ``loki.workspace.*`` (see
:mod:`loki_shared.messages.workspace`).

Run with ``python -m loki_workspace`` (configured by ``LOKI_*`` variables, see
:mod:`loki_workspace.settings`).
"""
