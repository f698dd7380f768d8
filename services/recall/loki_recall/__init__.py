"""Loki's recall service: the verbatim archive of blocks and the recall / recall_search tools.

Run with ``python -m loki_recall`` (configured by ``LOKI_*`` variables, see
:mod:`loki_recall.settings`).
"""
