"""A private PostgreSQL cluster for tests: started and removed by the test run itself.

`PostgresCluster` finds the server binaries (`pg_config --bindir`, else the newest
`/usr/lib/postgresql/*/bin`), runs `initdb` in a temporary folder, starts `postgres` on
127.0.0.1 on a free port with a socket folder of its own, and on `stop()` ends that one
postmaster (by its PID) and removes the folder. Nothing outside the folder is touched: no
system service is started or stopped.

`initdb` refuses to run as root. Run as root (as CI does), the cluster runs its server as an
unprivileged system user (`STELLO_PG_USER`, default `stello-pg`, created with `useradd`
when missing) who owns the temporary folder; clients connect over TCP on 127.0.0.1 only, where
the cluster trusts its own superuser `stello`.

    with PostgresCluster.start() as cluster:
        dsn = cluster.create_database("app")      # postgresql://stello@127.0.0.1:PORT/app

As a command (for make and CI)::

    python -m stello_graph.testing.postgres check          # exit 1 when no binaries
    python -m stello_graph.testing.postgres run -- CMD...  # CMD with STELLO_TEST_POSTGRES_DSN

Only the standard library is used (databases are made with the cluster's own `psql`), so this
module works without the `postgres` extra installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = [
    "DSN_ENV",
    "PostgresCluster",
    "PostgresUnavailableError",
    "find_bindir",
    "main",
]

DSN_ENV = "STELLO_TEST_POSTGRES_DSN"
"""Names a PostgreSQL database of your own for the suites; no private cluster is started then."""

SUPERUSER = "stello"
"""The cluster's superuser (trusted on 127.0.0.1 only)."""

_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 30.0
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries were found, or the private cluster failed to start."""


def find_bindir() -> Path | None:
    """The folder of the server binaries (`initdb`, `postgres`), or `None`.

    `pg_config --bindir` first (it names the installed server), then the newest Debian
    layout `/usr/lib/postgresql/<major>/bin`.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            candidates.append(Path(found))

    def major(path: str) -> int:
        digits = Path(path).parent.name
        return int(digits) if digits.isdigit() else 0

    candidates.extend(
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True)
    )
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as, when running as root (else `None`)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("STELLO_PG_USER", "stello-pg")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise PostgresUnavailableError(
            f"Running as root, the test cluster needs an unprivileged user {name!r} (initdb "
            "refuses root), and `useradd` is not there to create it: create the user, or set "
            "STELLO_PG_USER to an existing unprivileged one."
        )
    done = subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode not in (0, 9):  # 9: created meanwhile by another run
        raise PostgresUnavailableError(f"useradd {name!r} failed: {done.stderr.strip()}")
    return pwd.getpwnam(name)


@dataclass(slots=True)
class PostgresCluster:
    """A running private cluster; make one with `PostgresCluster.start()`."""

    bindir: Path
    root: Path
    """The temporary folder: `data/` (the cluster), `socket/`, `server.log`."""
    port: int
    process: subprocess.Popen[bytes]
    """The postmaster this cluster started (the only process `stop()` ends)."""
    _user: pwd.struct_passwd | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @classmethod
    def start(cls, *, bindir: Path | None = None, attempts: int = 3) -> PostgresCluster:
        """Initialise a cluster in a new temporary folder and start its server.

        Raises:
            PostgresUnavailableError: no server binaries, or the server did not start (the
                message holds the end of its log); nothing is left behind.
        """
        found = bindir or find_bindir()
        if found is None:
            raise PostgresUnavailableError(
                "No PostgreSQL server binaries found (`pg_config --bindir`, "
                "/usr/lib/postgresql/*/bin): install them (`bash .ci/postgres.sh` on Debian)."
            )
        user = _server_user()
        root = Path(tempfile.mkdtemp(prefix="stello-pg-"))
        try:
            (root / "socket").mkdir()
            if user is not None:
                for path in (root, root / "socket"):
                    os.chown(path, user.pw_uid, user.pw_gid)
            cls._initdb(found, root, user)
            for attempt in range(attempts):
                try:
                    return cls._launch(found, root, user)
                except PostgresUnavailableError:
                    if attempt == attempts - 1:  # a port taken meanwhile: try another
                        raise
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        raise AssertionError("unreachable")

    @staticmethod
    def _run_as(user: pwd.struct_passwd | None) -> tuple[int | None, int | None, list[int] | None]:
        """`user`, `group`, `extra_groups` of a subprocess run as `user` (or as we are)."""
        if user is None:
            return None, None, None
        return user.pw_uid, user.pw_gid, []

    @classmethod
    def _initdb(cls, bindir: Path, root: Path, user: pwd.struct_passwd | None) -> None:
        command = [
            str(bindir / "initdb"),
            *("-D", str(root / "data"), "-U", SUPERUSER, "--auth=trust"),
            *("--encoding=UTF8", "--locale=C", "--no-sync"),
        ]
        uid, gid, groups = cls._run_as(user)
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=root,
            check=False,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
        if done.returncode != 0:
            raise PostgresUnavailableError(f"initdb failed: {done.stderr.strip()[-2000:]}")

    @classmethod
    def _launch(cls, bindir: Path, root: Path, user: pwd.struct_passwd | None) -> PostgresCluster:
        port = _free_port()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": str(root / "socket"),
            "max_connections": "200",
            # a throwaway cluster: durability buys nothing here
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
        }
        command = [str(bindir / "postgres"), "-D", str(root / "data")]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        log = (root / "server.log").open("ab")
        uid, gid, groups = cls._run_as(user)
        try:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=root,
                start_new_session=True,  # a Ctrl-C of the test run reaches it through stop()
                user=uid,
                group=gid,
                extra_groups=groups,
            )
        finally:
            log.close()
        cluster = cls(bindir=bindir, root=root, port=port, process=process, _user=user)
        try:
            cluster._wait_ready()
        except BaseException:
            cluster._end_process()
            raise
        return cluster

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PostgresUnavailableError(
                    f"The test PostgreSQL server exited at start:\n{self.log_tail()}"
                )
            done = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                timeout=10,
                check=False,
            )
            if done.returncode == 0:
                return
            time.sleep(0.1)
        raise PostgresUnavailableError(
            f"The test PostgreSQL server was not ready in {_START_TIMEOUT:.0f} s:\n"
            f"{self.log_tail()}"
        )

    def log_tail(self, size: int = 3000) -> str:
        """The end of the server's log."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-size:]
        except OSError:
            return "(no log)"

    # -- databases ------------------------------------------------------------------------
    def dsn(self, database: str = "postgres") -> str:
        """The connection string of a database of the cluster (TCP, 127.0.0.1)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL with the cluster's `psql`; return its output (unaligned, tuples only)."""
        done = subprocess.run(
            [
                str(self.bindir / "psql"),
                *("-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
                *("-d", self.dsn(database), "-c", sql),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise PostgresUnavailableError(f"psql failed on {sql!r}: {done.stderr.strip()}")
        return done.stdout

    def create_database(self, name: str) -> str:
        """Create an empty database (a lower-case SQL name); return its DSN."""
        if not _NAME.match(name):
            raise ValueError(f"Database name {name!r} must match {_NAME.pattern}.")
        self.psql(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, ending the connections still open to it."""
        if not _NAME.match(name):
            raise ValueError(f"Database name {name!r} must match {_NAME.pattern}.")
        self.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    # -- stopping -------------------------------------------------------------------------
    def stop(self) -> None:
        """End this cluster's postmaster (fast shutdown, by PID) and remove its folder."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._end_process()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _end_process(self) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGINT)  # "fast" shutdown
        try:
            self.process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait(timeout=_STOP_TIMEOUT)

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """`check`: print the binaries' folder (exit 1 if none); `run -- CMD`: run CMD with
    `STELLO_TEST_POSTGRES_DSN` naming a database of a private cluster, then remove it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check"]:
        bindir = find_bindir()
        print(bindir if bindir else "no PostgreSQL server binaries found")
        return 0 if bindir else 1
    if args[:1] == ["run"]:
        command = args[2:] if args[1:2] == ["--"] else args[1:]
        if not command:
            print("usage: python -m stello_graph.testing.postgres run -- CMD...", file=sys.stderr)
            return 2
        with PostgresCluster.start() as cluster:
            env = {**os.environ, DSN_ENV: cluster.create_database("stello_test")}
            return subprocess.run(command, env=env, check=False).returncode
    print("usage: python -m stello_graph.testing.postgres {check | run -- CMD...}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
