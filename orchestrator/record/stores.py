"""The tracking store as this process reaches it: the URI to connect with (a password kept in
memory only), the checks before a launch (reachable, writable, holding MLflow's tables, damaged),
the lock held while a store is first opened, and the retrying MLflow client."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import logging
import os
import sqlite3
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .retries import first_line, retried, transient
from .secrets import CREDENTIALS, auth_headers, redact, redact_secrets, url_auth_headers, without_userinfo

# "Creating initial MLflow database tables..." is MLflow's business, not a line of the launch's console.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)


class TrackingError(RuntimeError):
    pass


def normalize_store(uri: str) -> str:
    """A relative SQLite path made absolute (so `resume` and `status` work from any folder), and a
    bare postgresql:// given the psycopg 3 driver we install (SQLAlchemy's default is psycopg2)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        try:
            return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
        except (OSError, RuntimeError, ValueError):  # a NUL, a name too long, a loop: check_store says so
            return uri
    if uri.startswith("postgresql://"):
        return "postgresql+psycopg://" + uri[len("postgresql://") :]
    return uri


_FULL_URIS: dict[str, str] = {}  # redacted -> full, for this process only


def remember(uri: str) -> str:
    """Keep `uri`'s password in this process's memory; returns the URI to store (redacted)."""
    _FULL_URIS[redact(uri)] = uri
    return redact(uri)


def reveal(uri: str) -> str:
    """The URI to connect with. A password is never stored (launch.json, pickles, MLflow): where a
    stored URI has one redacted, the full URI is the one this process launched with, or the one
    in MLFLOW_TRACKING_URI (for resume, status and reports)."""
    if "***" not in uri:
        return uri
    if uri in _FULL_URIS:
        return _FULL_URIS[uri]
    full = os.environ.get("MLFLOW_TRACKING_URI", "")
    if full and redact(normalize_store(full)) == uri:
        return normalize_store(full)
    raise TrackingError(
        f"{uri}: its password is not stored; set MLFLOW_TRACKING_URI to this URI with its password"
    )


def unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be made or written (judged by its nearest existing ancestor), or None."""
    try:
        existing = folder.resolve()
        while not existing.exists():
            existing = existing.parent
    except (OSError, RuntimeError, ValueError) as e:  # a name too long, a NUL, a symlink loop
        return f"not a usable path ({getattr(e, 'strerror', None) or e})"
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not a writable folder"
    try:  # root passes os.access everywhere, /proc and a root-squashed NFS mount included
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        return f"{existing} is not a writable folder ({e.strerror.lower()})"
    return None


def check_sqlite_store(uri: str) -> None:
    """A SQLite store's file, where it exists: a readable, writable SQLite database; else a folder
    where it can be made."""
    file = Path(uri[len("sqlite:///") :]).resolve()
    if file.is_dir():
        raise TrackingError(
            f"{file} is a folder, not a SQLite file (name the file: sqlite:///{file}/mlflow.db)"
        )
    if file.exists():
        if not file.is_file():  # a FIFO would block the read, a device never end
            raise TrackingError(f"{file} is not a regular file (a FIFO, a socket or a device)")
        with open(file, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise TrackingError(f"{file} is not a SQLite database")
        if not os.access(file, os.R_OK | os.W_OK):
            raise TrackingError(f"{file} is not readable and writable by this user")
        tables = sqlite_tables(file) if head else set()
        if tables and "experiments" not in tables:  # MLflow would write its tables among another's
            raise TrackingError(
                f"{file} is another program's SQLite database (tables: {', '.join(sorted(tables)[:5])}), "
                "not an MLflow store"
            )
        return
    problem = unwritable(file.parent)
    if problem:  # the folder itself is made at launch, once everything has been checked
        raise TrackingError(f"cannot create the SQLite store in {file.parent}: {problem}")


def sqlite_tables(file: Path) -> set[str]:
    """The tables of a SQLite file, read without writing; TrackingError where SQLite calls it damaged."""
    try:
        with contextlib.closing(sqlite3.connect(f"{file.as_uri()}?mode=ro", uri=True)) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as e:
        raise TrackingError(f"{file}: the tracking store's database is damaged: {e}") from None


def malformed(uri: str) -> str | None:
    """What makes `uri` one no connection can ever take (a port past 65535, no host, a NUL), or None:
    refused at once, not retried as an outage."""
    if any(ord(c) < 32 for c in uri):
        return "it holds a control character (a NUL, a line break)"
    try:
        parts = urllib.parse.urlsplit(uri)
        port = parts.port
    except ValueError as e:  # an out-of-range or non-numeric port, a bracket left open
        return f"malformed: {e}"
    if port == 0:
        return "malformed: port 0 takes no connection"
    if parts.scheme in ("http", "https") and not parts.hostname:
        return "malformed: no host"
    if uri.startswith("sqlite:///"):
        try:
            Path(uri[len("sqlite:///") :]).resolve().exists()
        except (OSError, RuntimeError, ValueError) as e:  # RuntimeError: a symlink loop
            return f"not a usable path ({getattr(e, 'strerror', None) or e})"
    return None


def refusal(uri: str, error: urllib.error.HTTPError, from_environment: dict) -> TrackingError:
    """A tracking server's answer that no retry changes (a 4xx), in one line."""
    answer = " ".join(error.read().decode(errors="replace").strip().splitlines()[:1])
    if error.code == 401:
        answer += (
            " (credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD were refused)"
            if from_environment
            else " (the URI's user and password were refused)"
            if url_auth_headers(uri)
            else " (it asks for credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)"
        )
    return TrackingError(f"tracking server {redact(uri)} refuses requests: {error.code} {answer}")


def check_tracking_server(uri: str, server_timeout_s: float) -> None:
    """A tracking server answers an API call with the credentials a launch's client would send;
    one that cannot be reached, or answers 5xx, is retried as an outage (StoreUnavailable)."""
    # Not /health, which MLflow exempts from its host check and its authentication: an API
    # call, with the credentials MLflow's client sends (from the environment, else the URL's
    # user:password@, which urllib would take for part of the host name), answers as a launch's will.
    bare, from_environment = without_userinfo(uri), auth_headers()
    request = urllib.request.Request(
        bare.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default",
        headers=from_environment or url_auth_headers(uri),
    )

    def ask() -> None:
        try:
            urllib.request.urlopen(request, timeout=server_timeout_s).read()
        except urllib.error.HTTPError as e:
            if e.code >= 500:
                raise ConnectionError(f"{e.code} {e.reason}") from None
            if e.code != 404:  # 404: no such experiment, but the server answered
                raise refusal(uri, e, from_environment) from None
        except OSError as e:
            raise ConnectionError(str(getattr(e, "reason", e))) from None

    retried(ask, f"tracking server {redact(uri)}")()


def refused_for_now(uri: str, error: BaseException) -> bool:
    """Whether a database that refused a connection may take it later (an outage: down, starting,
    shutting down, connections disallowed for a while) rather than never (no such database, bad
    credentials). PostgreSQL's refusals carry no SQLSTATE to the client (psycopg 3.3: `sqlstate`
    None), so its libpq ping and, where the server answers, its catalogue tell them apart."""
    if not uri.startswith("postgresql"):
        return transient(error)
    import psycopg  # noqa: PLC0415 - a PostgreSQL store's driver, imported only for one
    import sqlalchemy  # noqa: PLC0415 - as check_database's

    url = sqlalchemy.engine.make_url(uri)
    conninfo = psycopg.conninfo.make_conninfo(
        host=url.host, port=url.port, user=url.username, password=url.password, connect_timeout=5
    )
    ping = psycopg.pq.PGconn.ping(psycopg.conninfo.make_conninfo(conninfo, dbname=url.database).encode())
    if ping in (psycopg.pq.Ping.NO_RESPONSE, psycopg.pq.Ping.REJECT):
        return True  # down, or starting / shutting down
    if ping == psycopg.pq.Ping.NO_ATTEMPT:
        return False  # libpq cannot even try: a malformed address
    try:  # it answers: ask its maintenance database whether this one exists and takes connections
        with psycopg.connect(psycopg.conninfo.make_conninfo(conninfo, dbname="postgres")) as conn:
            row = conn.execute(
                "SELECT datallowconn FROM pg_database WHERE datname = %s", (url.database,)
            ).fetchone()
    except psycopg.OperationalError:
        return False  # these credentials are refused
    return row is not None  # no row: no such database


def check_database(uri: str, timeout_s: float) -> None:
    """A database store (PostgreSQL, ...) accepts a connection within `timeout_s`; one refused for
    now is retried as an outage (StoreUnavailable), one refused for good is a TrackingError."""
    # Here, as in store_exists and schema_lock: 0.4 s of imports a SQLite store goes without.
    import sqlalchemy  # noqa: PLC0415

    try:
        engine = sqlalchemy.create_engine(
            uri, connect_args={"connect_timeout": int(timeout_s)}, poolclass=sqlalchemy.pool.NullPool
        )
    except Exception as e:  # an unknown scheme, a driver not installed
        raise TrackingError(f"cannot open {redact(uri)}: {first_line(e)}") from None

    def connect() -> None:
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT 1"))
                return
        except Exception as e:  # driver errors differ per database
            refused, for_now = first_line(e), refused_for_now(uri, e)
        # Raised out of the handler: an error raised in it chains the driver's, which retried() reads.
        if for_now:
            raise ConnectionError(refused)
        raise TrackingError(f"{redact(uri)} refuses the connection: {refused}")

    try:
        retried(connect, f"tracking store {redact(uri)}")()
    finally:
        engine.dispose()


def check_store(uri: str, timeout_s: float = 5.0, server_timeout_s: float = 30.0) -> None:
    """Fail fast, before anything launches, if the tracking store cannot be reached. A server that
    refuses the connection fails at once; one that answers slowly gets `server_timeout_s`: a team
    server checking a password hash on loaded cores took over 5 s to answer, and a launch its
    MLflow client (which waits 120 s a request) would have tracked was refused."""
    uri = reveal(uri)
    found = CREDENTIALS.match(uri)
    if found and "@" in uri[found.end() :].split("/", 1)[0]:
        # A driver ends the password at its first @ and takes the rest for the host, which its
        # errors then print; redact (and so what is stored) would leave that rest in view too.
        raise TrackingError(
            f"{redact_secrets(uri)}: its password holds an @, which ends it where a driver reads it: "
            "write the @ as %40"
        )
    problem = malformed(uri)
    if problem:
        raise TrackingError(f"{redact(uri)}: {problem}")
    if uri.startswith("sqlite:///"):
        check_sqlite_store(uri)
    elif uri.startswith(("http://", "https://")):
        check_tracking_server(uri, server_timeout_s)
    else:
        check_database(uri, timeout_s)


def missing_sqlite_file(uri: str) -> str | None:
    """The database file a SQLite URI names, where it does not exist (opening it would create it)."""
    path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    return path if path is not None and not Path(path).is_file() else None


def damaged_store(error: BaseException) -> str | None:
    """SQLite's own word where `error` comes of a database file that is not one or is cut short
    ("file is not a database", "database disk image is malformed"), else None. Its subclasses
    (a locked or unreachable database) are other faults."""
    seen = error
    while seen is not None:
        if type(seen) is sqlite3.DatabaseError:
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


# Tables every MLflow store has held since its first schema: a store without one of them is damaged,
# and MLflow, opening it, would create the missing ones (an older store's later tables it migrates).
MLFLOW_TABLES = ("experiments", "runs", "metrics", "latest_metrics", "params", "tags", "alembic_version")


def store_exists(uri: str) -> bool:
    """Whether the store exists and holds MLflow's tables: opening one that does not (or holds only
    some of MLFLOW_TABLES) would create them."""
    uri = reveal(uri)
    if uri.startswith(("http://", "https://")):
        return True  # a tracking server's database is its own business
    if missing_sqlite_file(uri):
        return False  # SQLite would create the file
    import sqlalchemy  # noqa: PLC0415 - 0.4 s of imports a SQLite store goes without (check_database)

    engine = sqlalchemy.create_engine(uri)
    try:
        tables = retried(
            lambda: set(sqlalchemy.inspect(engine).get_table_names()), f"tracking store {redact(uri)}"
        )()
        return tables >= set(MLFLOW_TABLES)
    finally:
        engine.dispose()


def schema_problem(uri: str) -> str | None:
    """Why MLflow here cannot open the store's tables, where their schema is one it does not know (a
    newer MLflow's) or an older one it refuses without `mlflow db upgrade`; else None. Asked only once
    opening the store failed: reading MLflow's migrations takes seconds."""
    import mlflow  # noqa: PLC0415 - as store_exists' sqlalchemy
    import sqlalchemy  # noqa: PLC0415
    from alembic.script import ScriptDirectory  # noqa: PLC0415
    from alembic.util import CommandError  # noqa: PLC0415

    try:
        engine = sqlalchemy.create_engine(reveal(uri), poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as conn:
                version = conn.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar()
        finally:
            engine.dispose()
    except Exception:  # no such table, no answer: not a schema this question is about
        return None
    scripts = ScriptDirectory(os.path.join(os.path.dirname(mlflow.__file__), "store", "db_migrations"))
    head = scripts.get_current_head()
    if version == head:
        return None
    try:
        scripts.get_revision(version)
    except CommandError:
        return (
            f"its MLflow schema {version} is unknown to MLflow {mlflow.__version__} here (a newer MLflow's?)"
        )
    return (
        f"its MLflow schema {version} is older than MLflow {mlflow.__version__}'s ({head}): back the store "
        f"up, then `mlflow db upgrade {redact(uri)}`"
    )


_OPENED: set[tuple[str, str]] = set()  # (whose tables, store) this process has opened: they exist


SCHEMA_LOCK_KEY = 0x5359_5347  # "SYSG": this service's advisory lock in a PostgreSQL database


@contextlib.contextmanager
def schema_lock(uri: str, whose: str, what: str):
    """Held while a store is first opened, which creates or migrates its tables: two launches that
    opened a new store at once both migrated it (on SQLite the store then refused every later
    launch: "table _alembic_tmp_latest_metrics already exists"; on PostgreSQL one launch failed
    with a duplicate key). SQLite: the database folder's own lock (flock), no file of ours beside
    the user's; PostgreSQL: an advisory lock, taken as retried as any store call (`what` names the
    store); a tracking server serializes its own."""
    if (whose, uri) in _OPENED or not uri.startswith(("sqlite:///", "postgresql")):
        yield
        return
    with contextlib.ExitStack() as held:
        if uri.startswith("sqlite:///"):
            folder = Path(uri[len("sqlite:///") :]).parent
            if folder.is_dir():  # none: MLflow's own error says so
                handle = os.open(folder, os.O_RDONLY)
                held.callback(os.close, handle)
                fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            import sqlalchemy  # noqa: PLC0415 - as store_exists'

            engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
            held.callback(engine.dispose)

            def locked():
                connection = engine.connect()
                try:
                    connection.execute(
                        sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY}
                    )
                except BaseException:
                    with contextlib.suppress(Exception):
                        connection.close()
                    raise
                return connection

            connection = retried(locked, what)()

            # The lock goes with its connection, closed or terminated (the open retries on its own then).
            @held.callback
            def release() -> None:
                with contextlib.suppress(Exception):
                    connection.close()

        yield
        _OPENED.add((whose, uri))


class RetryingClient:
    """An MlflowClient whose calls survive a store that drops its connections for a while."""

    def __init__(self, uri: str):
        # Seconds of imports, paid once a store is opened (warm_up overlaps them).
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        # It logs each failed query (SQL, parameters, traceback) before raising it; retried() says it
        # in one line.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        # "error ignored terminating <Pipeline>": the same dropped connection
        logging.getLogger("psycopg").setLevel(logging.ERROR)
        # "Exception during reset or similar" with a traceback: the pool throwing a dropped connection away.
        logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
        self._uri = redact(uri)
        # Opening the store creates or migrates its tables: as much a store call as any other.
        full, what = reveal(uri), f"tracking store {self._uri}"
        with schema_lock(full, "mlflow", what):
            self._client = retried(MlflowClient, what)(tracking_uri=full)

    def __getattr__(self, name):
        return retried(getattr(self._client, name), f"tracking store {redact(self._uri)}")

    @property
    def unretried(self):
        """The client itself, each call tried once: for a driver already stopping on a store outage."""
        return self._client


def client(uri: str) -> RetryingClient:
    return RetryingClient(uri)


def warm_up(uri: str) -> None:
    """MLflow's imports and, where the store exists, a first read; nothing written, so a launch
    refused after this (its storage unseen by a node) leaves no store behind."""
    importlib.import_module("mlflow.store.tracking.sqlalchemy_store")  # seconds of imports

    if store_exists(uri):
        client(uri).search_experiments(max_results=1)
