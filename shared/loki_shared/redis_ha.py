"""Configuration of a Redis master, its replicas and the Sentinels watching them (issue 44).

Loki's Redis has one ACL user per service and ``default`` off
(:func:`loki_shared.permissions.redis_config`). A replica and the sentinels must log in too:

- the **replica** replicates as :data:`REPLICATION_USER` (``masteruser`` / ``masterauth``,
  ACL :data:`REPLICATION_RULES`: ``PSYNC``, ``REPLCONF``, ``PING`` only);
- each **sentinel** watches and reconfigures the servers as :data:`SENTINEL_USER`
  (``sentinel auth-user`` / ``auth-pass``, ACL :data:`SENTINEL_RULES`: the commands a failover
  sends — ``INFO``, ``ROLE``, ``REPLICAOF``, ``CONFIG REWRITE``, ``CLIENT KILL``...).

Both users go into every server's ACL (:func:`acl_users`, passed as ``extra`` to
:func:`loki_shared.credentials.write_redis_config`), and every server — the master too —
carries ``masteruser``/``masterauth`` (:func:`replication_lines`), because after a failover
the old master comes back as a replica of the new one.

Used by the tests that run a real master, replica and three sentinels on loopback, and shown
in docs/deployment.md's multi-node example. Loki's services only read the resulting
``redis+sentinel://`` URL (:mod:`loki_shared.redis_client`).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

#: The ACL user a replica replicates as.
REPLICATION_USER = "replication"
#: The ACL user the sentinels log in to the servers as.
SENTINEL_USER = "sentinel"

#: ACL rules of :data:`REPLICATION_USER` (Redis's documented minimum for a replica).
REPLICATION_RULES: tuple[str, ...] = ("resetchannels", "-@all", "+psync", "+replconf", "+ping")
#: ACL rules of :data:`SENTINEL_USER` (Redis's documented set for a sentinel).
SENTINEL_RULES: tuple[str, ...] = (
    "allchannels",
    "-@all",
    "+multi",
    "+exec",
    "+slaveof",
    "+replicaof",
    "+ping",
    "+subscribe",
    "+publish",
    "+info",
    "+role",
    "+config|rewrite",
    "+client|setname",
    "+client|kill",
    "+script|kill",
)


def acl_users(
    replication_password: str, sentinel_password: str
) -> dict[str, tuple[str, list[str]]]:
    """The two extra ACL users, in the shape ``write_redis_config(extra=...)`` takes
    (name -> (password, rules))."""
    return {
        REPLICATION_USER: (replication_password, list(REPLICATION_RULES)),
        SENTINEL_USER: (sentinel_password, list(SENTINEL_RULES)),
    }


def replication_lines(replication_password: str, master: tuple[str, int] | None = None) -> str:
    """redis.conf lines that let a server replicate (``masteruser``/``masterauth``) and, with
    ``master`` given as ``(host, port)``, make it a replica of it (``replicaof``)."""
    lines = [f"masteruser {REPLICATION_USER}", f"masterauth {replication_password}"]
    if master is not None:
        lines.append(f"replicaof {master[0]} {master[1]}")
    return "\n".join(lines) + "\n"


def sentinel_config(
    port: int,
    master: tuple[str, int],
    sentinel_password: str,
    *,
    service: str = "loki",
    quorum: int = 2,
    down_after_ms: int = 5000,
    failover_timeout_ms: int = 60000,
    host: str = "127.0.0.1",
    data_dir: str | None = None,
) -> str:
    """A sentinel.conf (``redis-server <file> --sentinel``; the file must stay writable: the
    sentinel records what it learns in it) that watches ``master`` under the name ``service``
    (the ``<service>`` of a ``redis+sentinel://`` URL).

    ``quorum``: sentinels that must agree the master is down (2 of 3); ``down_after_ms``:
    milliseconds without an answer before a sentinel holds it down; ``failover_timeout_ms``:
    bound of one failover attempt. The sentinel itself requires no login here.
    """
    lines = [
        f"port {port}",
        f"bind {host}",
        "protected-mode no",
        *([f"dir {data_dir}"] if data_dir else []),
        "sentinel resolve-hostnames yes",
        f"sentinel monitor {service} {master[0]} {master[1]} {quorum}",
        f"sentinel auth-user {service} {SENTINEL_USER}",
        f"sentinel auth-pass {service} {sentinel_password}",
        f"sentinel down-after-milliseconds {service} {down_after_ms}",
        f"sentinel failover-timeout {service} {failover_timeout_ms}",
        f"sentinel parallel-syncs {service} 1",
    ]
    return "\n".join(lines) + "\n"


#: The file of :func:`init_folder` keeping the two passwords, beside ``credentials.json``.
HA_FILE = "redis-ha.json"
#: The subfolder of :func:`init_folder` the servers and sentinels mount.
HA_FOLDER = "redis-ha"


def init_folder(
    folder: Path, master: tuple[str, int] = ("redis", 6379), service: str = "loki"
) -> Path:
    """The compose init step of the multi-node example (``docker-compose.cluster.yml``), run
    after ``python -m loki_shared.credentials init DIR``: the passwords of
    :data:`REPLICATION_USER` and :data:`SENTINEL_USER` (kept, or created once, in
    ``folder/redis-ha.json``, 0600) and ``folder/redis-ha/`` (0755, files 0644):

    - ``redis.conf``: every ACL user (the services', the health check's and the two above)
      and ``masteruser``/``masterauth`` — for the master and the replicas alike;
    - ``password``: the health check user's password (as ``redis/password``);
    - ``sentinel.conf``: the template each sentinel copies once into its own writable volume
      (it watches ``master`` as ``service``, quorum 2).

    Returns the subfolder.

    Raises:
        loki_shared.credentials.CredentialsError: ``folder/credentials.json`` is missing or
            cannot be read (run ``python -m loki_shared.credentials init DIR`` first).
    """
    from . import credentials, permissions

    creds = credentials.load(folder / credentials.FILE)
    keep = folder / HA_FILE
    if keep.exists():
        passwords = json.loads(keep.read_text())
    else:
        passwords = {
            "replication": secrets.token_urlsafe(24),
            "sentinel": secrets.token_urlsafe(24),
        }
        credentials._write_private(keep, json.dumps(passwords, indent=1), 0o600)
    out = folder / HA_FOLDER
    conf = permissions.redis_config(
        creds.redis, acl_users(passwords["replication"], passwords["sentinel"])
    )
    files = {
        "redis.conf": conf + replication_lines(passwords["replication"]),
        "password": creds.redis[permissions.REDIS_HEALTH_USER],
        "sentinel.conf": sentinel_config(
            26379, master, passwords["sentinel"], service=service, host="0.0.0.0", data_dir="/data"
        ),
    }
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o755)
    for name, text in files.items():
        credentials._write_private(out / name, text, 0o644)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m loki_shared.redis_ha init DIR [--master HOST:PORT]``: see
    :func:`init_folder`. Exit 0, or 1 with one line on stderr."""
    import argparse

    from .credentials import CredentialsError

    parser = argparse.ArgumentParser(prog="python -m loki_shared.redis_ha")
    parser.add_argument("action", choices=["init"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--master", default="redis:6379", help="the first master, HOST:PORT")
    args = parser.parse_args(argv)
    host, _, port = args.master.rpartition(":")
    try:
        out = init_folder(args.folder, (host, int(port)))
    except (CredentialsError, ValueError, OSError) as exc:
        print(f"loki redis-ha: {exc}", file=sys.stderr)
        return 1
    print(f"Redis replication and Sentinel files ready in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
