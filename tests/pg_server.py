"""A PostgreSQL server for the tests: ``PARALLAX_TEST_PG_URL`` if set, else a throwaway cluster.

The throwaway cluster is Debian's (``/usr/lib/postgresql/*/bin``) or any ``initdb`` on PATH,
initialised in a temporary folder, listening on 127.0.0.1 on a free port with a random password,
without fsync (nothing in it needs to survive a crash), and deleted when the tests end. It
starts in about a second. PostgreSQL refuses to run as root, so as root it runs as the
``postgres`` user that Debian's package creates.

Each test gets a database of its own on that server (``create_database`` / ``drop_database``).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy import URL, create_engine, make_url, pool, text

NOT_INSTALLED = "PostgreSQL is not installed"
START_TIMEOUT_S = 30


class Unavailable(Exception):
    """No server can be had: the reason is the skip message."""


def find_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the newest Debian version, else PATH."""
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if debian:
        return Path(debian[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary folder; ``stop`` deletes it."""

    def __init__(self, binaries: Path):
        self.binaries = binaries
        self.run_as = _unprivileged_user()
        # As root the server runs as another user, who must reach the folder: /tmp always lets it
        # (a TMPDIR under /root would not), and keeps the socket path short.
        self.folder = Path(tempfile.mkdtemp(prefix="parallax-pg-", dir="/tmp" if self.run_as else None))
        self.password = secrets.token_hex(12)
        self.port = _free_port()
        self.data = self.folder / "data"
        self._started = False

    def start(self) -> URL:
        """initdb and start; the URL of its ``postgres`` database as the superuser ``parallax``."""
        if self.run_as is not None:
            os.chmod(self.folder, 0o700)
            os.chown(self.folder, self.run_as.pw_uid, self.run_as.pw_gid)
        password_file = self.folder / "password"
        password_file.write_text(self.password)
        if self.run_as is not None:
            os.chown(password_file, self.run_as.pw_uid, self.run_as.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "parallax", f"--pwfile={password_file}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync")
        password_file.unlink()
        for attempt in range(3):  # the free port may be taken before the server binds it
            options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -F -c full_page_writes=off -c max_connections=200"
            try:
                self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.folder / "server.log"),
                          "-w", "-t", str(START_TIMEOUT_S), "start")
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                self.port = _free_port()
        self._started = True
        return URL.create("postgresql+psycopg", username="parallax", password=self.password,
                          host="127.0.0.1", port=self.port, database="postgres")

    def stop(self) -> None:
        try:
            if self._started:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.binaries / program), *args]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as.pw_name, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            log = self.folder / "server.log"
            details = log.read_text() if log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}{details}")


def create_database(server: URL) -> URL:
    """A new empty database on ``server``; its URL."""
    name = f"parallax_test_{os.getpid()}_{secrets.token_hex(4)}"
    _admin(server, f'CREATE DATABASE "{name}"')
    return server.set(database=name)


def drop_database(server: URL, database: URL) -> None:
    # FORCE: a test's engine or a killed supervisor may still hold a connection.
    _admin(server, f'DROP DATABASE IF EXISTS "{database.database}" WITH (FORCE)')


def server_from_env() -> URL | None:
    url = os.environ.get("PARALLAX_TEST_PG_URL")
    return make_url(url) if url else None


def _admin(server: URL, statement: str) -> None:
    engine = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def _unprivileged_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise Unavailable("PostgreSQL refuses to run as root and there is no postgres user to run it as") from None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

