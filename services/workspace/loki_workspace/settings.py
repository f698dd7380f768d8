"""Settings of the workspace service (``LOKI_*`` environment variables, read at start-up)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from loki_shared.settings import LokiSettings

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


class Settings(LokiSettings):
    """The shared fields (see :class:`loki_shared.settings.LokiSettings`) and:

    - ``LOKI_WORKSPACE_ROOT`` — the folder holding one workspace per project
      (``<root>/<project>``); default ``LOKI_HOME/workspaces``.
    - ``LOKI_WORKSPACE_WORKERS`` — requests handled at once per subject (default 4).
    - ``LOKI_WORKSPACE_RUN_MAX_S`` — the longest a command may run, seconds (default 600): a
      request's ``timeout_s`` is capped by it.
    - ``LOKI_WORKSPACE_OUTPUT_MAX`` — bytes of a command's output kept in the reply, the
      first and the last half (default 256 KiB).
    - ``LOKI_WORKSPACE_OUTPUT_KILL`` — bytes of output after which the command is killed
      (``killed: output``; default 8 MiB).
    - ``LOKI_WORKSPACE_MEMORY_MAX`` — address space of each sandboxed process, bytes
      (``RLIMIT_AS``; default 2 GiB).
    - ``LOKI_WORKSPACE_PROCS_MAX`` — processes (and threads) at once in one sandbox
      (``RLIMIT_NPROC`` counted in the sandbox's own user namespace; default 256).
    - ``LOKI_WORKSPACE_FILE_MAX`` — the largest file a command may write, bytes
      (``RLIMIT_FSIZE``; default 1 GiB).
    - ``LOKI_WORKSPACE_READ_MAX`` — bytes of text one ``read`` returns at most (default
      256 KiB; more is ``truncated``).
    - ``LOKI_WORKSPACE_WRITE_MAX`` — the largest file ``write``/``edit`` make, bytes
      (default 8 MiB).
    - ``LOKI_WORKSPACE_AGENTS_MAX`` — characters of ``AGENTS.md`` given in a workspace's
      info (default 20000).
    - ``LOKI_WORKSPACE_UID`` / ``LOKI_WORKSPACE_GID`` — the unprivileged user the sandbox
      runs as when the service runs as root (default 65534, ``nobody``): the kernel does not
      limit the processes of root, so the sandbox never runs as root. The workspaces' files
      belong to it.
    - ``LOKI_WORKSPACE_BWRAP`` — the bubblewrap program (default ``bwrap``, looked up on
      ``PATH``).
    - ``LOKI_WORKSPACE_BROWSER`` — the headless browser of ``preview`` (default
      ``chromium``, Debian's); missing, a preview is the page's text only.
    - ``LOKI_WORKSPACE_PREVIEW_TIMEOUT_S`` — seconds a preview's browser gets (default 30).
    - ``LOKI_WORKSPACE_GREP_MAX_S`` — seconds a ``grep`` or a ``glob`` may search (default
      15; below the chat's wait of a file operation): past it the search is stopped and
      refused, so a pattern that backtracks without end never holds the service.
    """

    workspace_root: Path | None = Field(default=None, description="Folder of the workspaces.")
    workspace_workers: int = Field(default=4, ge=1, description="Concurrent requests.")
    workspace_run_max_s: float = Field(default=600.0, gt=0, description="Longest command, s.")
    workspace_output_max: int = Field(default=256 * KIB, ge=1024, description="Output kept.")
    workspace_output_kill: int = Field(default=8 * MIB, ge=1024, description="Output limit.")
    workspace_memory_max: int = Field(default=2 * GIB, ge=64 * MIB, description="RLIMIT_AS.")
    workspace_procs_max: int = Field(default=256, ge=8, description="RLIMIT_NPROC.")
    workspace_file_max: int = Field(default=GIB, ge=MIB, description="RLIMIT_FSIZE.")
    workspace_read_max: int = Field(default=256 * KIB, ge=1024, description="Read cap.")
    workspace_write_max: int = Field(default=8 * MIB, ge=1024, description="Write cap.")
    workspace_agents_max: int = Field(default=20_000, ge=100, description="AGENTS.md cap.")
    workspace_uid: int = Field(default=65534, ge=1, description="Sandbox uid under root.")
    workspace_gid: int = Field(default=65534, ge=1, description="Sandbox gid under root.")
    workspace_bwrap: str = Field(default="bwrap", description="The bubblewrap program.")
    workspace_browser: str = Field(default="chromium", description="The preview browser.")
    workspace_preview_timeout_s: float = Field(default=30.0, gt=0, description="Preview, s.")
    workspace_grep_max_s: float = Field(default=15.0, gt=0, description="A grep's bound, s.")

    def root(self) -> Path:
        """The workspaces' folder, absolute: ``LOKI_WORKSPACE_ROOT``, else
        ``LOKI_HOME/workspaces``."""
        return (self.workspace_root or self.home / "workspaces").absolute()
