"""A real, throw-away PostgreSQL server for the tests: initdb + pg_ctl in a temporary directory,
listening on a free loopback port, stopped and deleted afterwards. Never a mock.

When the binaries are missing the tests that need a server are skipped locally, but fail under CI
(``CI=true``), where ``.ci/run`` installs them.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str | None:
    """None when a server can be started, else the reason it cannot."""
    missing = [n for n in ("initdb", "pg_ctl") if _bin(n) is None]
    if missing:
        return f"PostgreSQL binaries not found: {', '.join(missing)}"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return 'psycopg is not installed (pip install -e ".[test,postgres]")'
    return None


# dsn -> how to stop and start its server again (``crash_and_restart``)
_RUNNING: dict[str, tuple[list[str], Path, str, Path]] = {}


@contextmanager
def server(settings: str = "") -> Iterator[str]:
    """Start a server (``settings``: more ``-c name=value`` options); yield the DSN of its
    maintenance database."""
    root = Path(tempfile.mkdtemp(prefix="dpbudget-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    port = _free_port()
    # initdb refuses to run as root: run the server as the 'postgres' OS user in that case.
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    run = {"check": True, "capture_output": True, "text": True}
    subprocess.run(prefix + [_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "dpbudget",
                             "--no-sync", "-E", "UTF8"], **run)
    options = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=on {settings}"
    subprocess.run(prefix + [_bin("pg_ctl"), "-D", str(data), "-o", options, "-l",
                             str(root / "log"), "-w", "-t", "60", "start"], **run)
    dsn = f"postgresql://dpbudget@127.0.0.1:{port}/postgres"
    _RUNNING[dsn] = (prefix, data, options, root)
    try:
        yield dsn
    finally:
        _RUNNING.pop(dsn, None)
        subprocess.run(prefix + [_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                                 "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def crash_and_restart(dsn: str) -> None:
    """Stop the server of ``dsn`` as a crash does (immediate: what is not on disk is lost), then
    start it again."""
    prefix, data, options, root = _RUNNING[dsn]
    run = {"check": True, "capture_output": True, "text": True}
    subprocess.run(prefix + [_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                   **run)
    subprocess.run(prefix + [_bin("pg_ctl"), "-D", str(data), "-o", options, "-l",
                             str(root / "log"), "-w", "-t", "60", "start"], **run)


def fresh_database(maintenance_dsn: str) -> str:
    """Create an empty database on the server; return its DSN."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(maintenance_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return maintenance_dsn.rsplit("/", 1)[0] + f"/{name}"
