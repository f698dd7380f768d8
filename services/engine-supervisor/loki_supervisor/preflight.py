"""Checks made before llama-server is launched, so a failure that would happen again is said
plainly once instead of being retried: the model file exists, can be read, and starts with the
GGUF magic (``GGUF``, the first four bytes of every GGUF file: ggml's ``docs/gguf.md``).

Whether llama-server accepts the file beyond its magic (version, architecture, tensors) is
the engine's to say: a launch that exits before its first healthy ``/health`` is reported
``failed`` with its output and not retried (:mod:`loki_supervisor.engine_process`).
"""

from __future__ import annotations

import errno
from pathlib import Path

from .errors import EngineStartError

GGUF_MAGIC = b"GGUF"


class ModelFileError(EngineStartError):
    """The model file is missing, unreadable or not a GGUF file: launching would fail the
    same way every time (``permanent``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


def check_model_file(path: Path, source: str = "LOKI_MODEL") -> None:
    """Check that ``path`` is a readable GGUF file; ``source`` names where the path came from
    (``LOKI_MODEL``, or ``preset <id>``) in the message.

    Raises:
        ModelFileError: it does not exist, is not a regular file, cannot be read, or does not
            start with the GGUF magic.
    """
    where = f"model file {path} ({source})"
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        raise ModelFileError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise ModelFileError(f"{where} is a directory, not a GGUF file") from None
    except PermissionError:
        raise ModelFileError(f"{where} cannot be read: permission denied for this user") from None
    except OSError as exc:
        why = errno.errorcode.get(exc.errno or 0, "") or type(exc).__name__
        raise ModelFileError(f"{where} cannot be read: {exc.strerror or why}") from None
    if head != GGUF_MAGIC:
        raise ModelFileError(
            f"{where} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})"
        )
