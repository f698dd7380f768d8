"""The recall service's Redis keys (the deletion records shared with the chat store are in
:mod:`loki_shared.recall_purge`)."""

from __future__ import annotations

#: The global sequence (``INCR``: from 1, strictly increasing, never reused).
SEQ_KEY = "loki:recall:seq"
#: Hash ``<seq>`` → sealed block.
BLOCKS_KEY = "loki:recall:blocks"
#: + ``c:<conversation>`` / ``p:<project>``: the set of seqs that conversation / project owns.
OWNER_PREFIX = "loki:recall:owner:"
#: List of every deleted seq, in the order of deletion.
DELETED_KEY = "loki:recall:deleted"
#: Set once every block stored before the owner sets existed has been added to them.
OWNERS_DONE_KEY = "loki:recall:owners_v1"
