"""MLflow: one experiment per search-space file, a parent run per launch, a child run per trial.

The store's side only, without Ray (`status` and reports import this alone); the Tune callback
that writes the trial runs from the driver is callbacks.TrialTracker.
"""
from __future__ import annotations

import abc
import contextlib
import fcntl
import functools
import importlib
import json
import logging
import math
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from trainables.tasks.base import GENERATOR_VERSION, LOWER_IS_BETTER, SCORES_OF_KIND

STATUS_TAG = "trial_status"  # running | completed | early_stopped | diverged | failed | interrupted | lost
DIVERGED_AT_TAG = "diverged_at"  # the iteration by which a diverged run's loss was NaN or infinite
ENDED = ("completed", "diverged", "failed")  # how a run ends on its own: what a cell's seeds came to
CONFIG_TAG = "trial_config"  # the full flat trial config as JSON, what `orchestrator best` writes out
DATA_VERSION_TAG = "data_version"  # trainables.tasks.base.GENERATOR_VERSION: the tasks' data a run trained and was tested on
MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
REPLAY_KEY = "replayed_evaluations"  # in a restored trial's first result: the evaluations its checkpoint holds, as JSON


# "Creating initial MLflow database tables..." is MLflow's business, not a line of the launch's console.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)

RETRY_DELAYS_S = (0.5, 1, 2, 4, 8, 16)  # a store that drops connections gets about 30 s to come back


class TrackingError(RuntimeError):
    pass


class StoreUnavailable(RuntimeError):
    """A store stayed unreachable through every retry."""


# user:password@ as SQLAlchemy reads it (sqlalchemy.engine.url): the password runs to the first @,
# so it may hold / # ? where urllib's split ends the host part and sees no password at all.
_CREDENTIALS = re.compile(r"^(?P<head>[\w+.-]+://[^:/]*):(?P<password>[^@]*)@")


# A key that names a secret (psycopg takes ?password= and ?sslpassword=; S3 clients an
# aws_secret_access_key), but not a word that merely starts like one (token_acc, a score).
_SECRET_KEY = r"[\w-]*?(?:password|passwd|pwd|secret|token|secret_access_key|secret_key|access_key_id|api_key)\b"
# user:password@ of any URI in a line (a user name may hold @, Azure's user@server); the password
# runs to the last @ before a space or quote, so that an unencoded @ in it leaves no tail behind;
# digits then / ? # after the colon are a port (http://host:8080/a@b), not a password (the URI
# in use is redacted exactly, whatever its password, by redact and redact_text).
_URI_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][\w+.-]*://[^:/\s'\"]*):(?!\d*[/?#])[^\s'\"]*@")
_QUERY_SECRET = re.compile(rf"(?i)(?P<head>[?&;]{_SECRET_KEY}=)[^&#\s'\")\]}}`]*")
# A mapping's value (a query's was redacted above): a quoted one to its closing quote, a plain one
# to the next delimiter; the plain one becomes '***', which a YAML reader takes for a string, not an
# alias, so that a stored file stays readable.
_KEY_SECRET = re.compile(rf"(?i)(?<![?&;\w-])(?P<head>['\"]?{_SECRET_KEY}['\"]?\s*[:=]\s*)"
                         rf"(?:(?P<quote>['\"])(?:(?!(?P=quote)).)*(?P=quote)|[^'\",;)\]}}`\s]+)")


def redact_secrets(text: str) -> str:
    """`text` (a message, a traceback, a file) with every secret it shows as a URI's password, a
    URI's secret query value or a secret-named key's value replaced by ***."""
    text = _QUERY_SECRET.sub(r"\g<head>***", _URI_PASSWORD.sub(r"\g<head>:***@", text))
    return _KEY_SECRET.sub(lambda m: m["head"] + (f"{m['quote']}***{m['quote']}" if m["quote"] else "'***'"), text)


def redact(uri: str) -> str:
    """The URI without its password, for messages and for what is stored."""
    return _QUERY_SECRET.sub(r"\g<head>***", _CREDENTIALS.sub(r"\g<head>:***@", uri, count=1))


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
    raise TrackingError(f"{uri}: its password is not stored; set MLFLOW_TRACKING_URI to this URI with its password")


def redact_text(text: str, uri: str) -> str:
    """`text` (a search-space file, an error) without secrets (redact_secrets), nor the password of
    `uri` where it stands in a URI, however odd its characters: a password that is also a common
    word leaves the rest of the text alone."""
    found = _CREDENTIALS.match(uri)
    text = text.replace(f":{found['password']}@", ":***@") if found and found["password"] else text
    return redact_secrets(text)


def transient(error: BaseException) -> bool:
    """Whether an error means "the store is unreachable right now" (worth retrying) rather than a
    request it refused."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    seen = error
    while seen is not None:
        if isinstance(seen, StoreUnavailable):  # an inner call has already retried for the whole budget
            return False
        if isinstance(seen, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.PendingRollbackError,
                             ConnectionError, TimeoutError)):
            return True  # PendingRollbackError: a session whose connection dropped mid-transaction (retried() may reset it)
        if isinstance(seen, MlflowException) and seen.error_code == "TEMPORARILY_UNAVAILABLE":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_outage(error: BaseException) -> str | None:
    """The one-line reason if `error` (as Tune re-raises it) comes from a store outage."""
    seen = error
    while seen is not None:
        if isinstance(seen, StoreUnavailable):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


class RetryNotices:
    """Our line for a store fault being retried, in place of the library's ERROR log and traceback
    (MLflow logs every failed query before raising it to us): at most one every `every_s`, so a burst
    of dropped connections reads as a few lines, each counting the retries it stands for."""

    def __init__(self, every_s: float = 10.0):
        self.every_s, self.last, self.unsaid = every_s, -math.inf, 0

    def retrying(self, what: str, reason: str, delay: float) -> None:
        self.unsaid += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            burst = f" ({self.unsaid} calls retried since the last notice)" if self.unsaid > 1 else ""
            print(f"[store] {what}: {reason}; retrying in {delay:g} s{burst}", flush=True)
            self.last, self.unsaid = now, 0


NOTICES = RetryNotices()


def first_line(error: BaseException) -> str:
    """The reason a store call failed: the first line of the innermost error (the driver's, not a
    wrapper's such as Optuna's "An exception is raised during the commit ... invalid data"),
    without SQLAlchemy's "(psycopg.errors.AdminShutdown) " prefix."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    text = str(getattr(error, "orig", None) or error).strip() or type(error).__name__
    return re.sub(r"^\([\w.]+\) ", "", text.splitlines()[0])[:200]


def retried(method, what: str, reset=None):
    """`method`, called again with backoff while the store is unreachable (after `reset(*args)`,
    where given); StoreUnavailable once RETRY_DELAYS_S are spent."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        for delay in (*RETRY_DELAYS_S, None):
            try:
                return method(*args, **kwargs)
            except Exception as e:
                if not transient(e):
                    raise
                if delay is None:
                    raise StoreUnavailable(f"{what} unreachable for {sum(RETRY_DELAYS_S):.0f} s "
                                           f"({len(RETRY_DELAYS_S) + 1} tries): {first_line(e)}") from e
                NOTICES.retrying(what, first_line(e), delay)
                time.sleep(delay)
                if reset is not None:
                    reset(*args)

    return call


class RetryingClient:
    """An MlflowClient whose calls survive a store that drops its connections for a while."""

    def __init__(self, uri: str):
        from mlflow.tracking import MlflowClient

        # It logs each failed query (SQL, parameters, traceback) before raising it; retried() says it in one line.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        logging.getLogger("psycopg").setLevel(logging.ERROR)  # "error ignored terminating <Pipeline>": the same dropped connection
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


def search_storage(uri: str, launch_dir: Path, read_only: bool = False):
    """The Optuna storage of a launch (see search_store), its calls retried like MLflow's.
    `read_only`: for the commands that only read a launch's studies (dashboard, report), which a
    team may give a role that can create nothing: no schema is created (Optuna creates its tables
    only where they are missing, so none there either)."""
    what, revealed = "search store (Optuna)", reveal(uri)
    # PostgreSQL's optuna schema is made in search_store, under the lock too
    with schema_lock(revealed if revealed.startswith("postgresql") else search_store(revealed, launch_dir, create=False)[0], "optuna", what):
        url, engine_kwargs = retried(search_store, what)(revealed, launch_dir, create=not read_only)
        if read_only and missing_sqlite_file(url):  # opening it would create an empty one, of no studies
            raise TrackingError(f"no search store (Optuna) at {missing_sqlite_file(url)}: the launch's studies were kept there")
        return retried(ReconnectingRDBStorage, what)(url, engine_kwargs=engine_kwargs)  # it creates its tables where missing


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
            folder = Path(uri[len("sqlite:///"):]).parent
            if folder.is_dir():  # none: MLflow's own error says so
                handle = os.open(folder, os.O_RDONLY)
                held.callback(os.close, handle)
                fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            import sqlalchemy

            engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
            held.callback(engine.dispose)

            def locked():
                connection = engine.connect()
                try:
                    connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
                except BaseException:
                    with contextlib.suppress(Exception):
                        connection.close()
                    raise
                return connection

            connection = retried(locked, what)()

            @held.callback
            def release() -> None:  # the lock goes with its connection, closed or terminated (the open retries on its own then)
                with contextlib.suppress(Exception):
                    connection.close()
        yield
        _OPENED.add((whose, uri))


def fresh_session(storage, *args, **kwargs) -> None:
    """Discard `storage`'s (an Optuna RDBStorage) thread's session: the next call opens another."""
    try:
        storage.scoped_session.remove()
    except Exception:  # noqa: BLE001 - closing a session on a dead connection may fail; it is discarded anyway
        pass


def read_only_view(storage, study_names: set[str]):
    """`storage` as the dashboard may see it: the named studies only (a search store holds every
    launch's and every experiment's), and no write (optuna-dashboard can create, rename and delete
    studies and tell trials; `read_only` of search_storage only spares the schema). Reads go to the
    live storage, so a running launch's trials appear as they finish."""
    import optuna
    from optuna.storages import BaseStorage

    class ReadOnlyStudies(BaseStorage):
        def _own(self, study_id: int) -> int:
            if storage.get_study_name_from_id(study_id) not in study_names:
                raise KeyError(f"no study with id {study_id}")  # what Optuna raises for an unknown id
            return study_id

        def get_all_studies(self):
            return [s for s in storage.get_all_studies() if s.study_name in study_names]

        def get_study_id_from_name(self, study_name):
            if study_name not in study_names:
                raise KeyError(f"no study named {study_name!r}")
            return storage.get_study_id_from_name(study_name)

        def get_study_name_from_id(self, study_id):
            return storage.get_study_name_from_id(self._own(study_id))

        def get_study_directions(self, study_id):
            return storage.get_study_directions(self._own(study_id))

        def get_study_user_attrs(self, study_id):
            return storage.get_study_user_attrs(self._own(study_id))

        def get_study_system_attrs(self, study_id):
            return storage.get_study_system_attrs(self._own(study_id))

        def get_all_trials(self, study_id, deepcopy=True, states=None):
            return storage.get_all_trials(self._own(study_id), deepcopy=deepcopy, states=states)

        def get_trial(self, trial_id):
            for study in self.get_all_studies():
                if any(t._trial_id == trial_id for t in storage.get_all_trials(study._study_id, deepcopy=False)):
                    return storage.get_trial(trial_id)
            raise KeyError(f"no trial with id {trial_id}")

    def refuse(self, *args, **kwargs):
        raise optuna.exceptions.StorageInternalError("this dashboard is read-only: the launch's studies change only through the launch")

    for name in BaseStorage.__abstractmethods__ - set(vars(ReadOnlyStudies)):  # every write
        setattr(ReadOnlyStudies, name, refuse)
    abc.update_abstractmethods(ReadOnlyStudies)
    return ReadOnlyStudies()


def _reconnecting_rdb_storage():
    import optuna

    import inspect

    class ReconnectingRDBStorage(optuna.storages.RDBStorage):
        """Optuna's SQL storage, each call that opens its own session retried while the database
        is unreachable: a connection the server dropped mid-call is replaced (pool_pre_ping covers
        idle ones). That includes private ones such as `_get_trials`, which Optuna's cache calls
        directly when TPE samples; those working in a caller's session are left to the caller."""

        def __getstate__(self):  # Tune pickles the searcher, and with it this storage: no password
            return super().__getstate__() | {"url": redact(self.url)}

        def __setstate__(self, state):
            # Unpickled as Tune restores the searcher, where it connects: the database may be down then.
            retried(super().__setstate__, "search store (Optuna)")(state | {"url": reveal(state["url"])})

    for name, method in vars(optuna.storages.RDBStorage).items():
        # Only the calls that open their own session: a helper handed rows read in its caller's
        # session (_build_frozen_trial_from_trial_model) cannot be retried in a fresh one, whose
        # reset detaches those rows (every retry then failed with DetachedInstanceError; CI's
        # connection-dropping test saw Optuna's "exception is raised during the commit").
        if inspect.isfunction(method) and not name.startswith("__") and "_create_scoped_session(" in inspect.getsource(method):
            # A session whose connection dropped mid-transaction refuses every later call until it
            # is rolled back, which a dead connection cannot do: retry with a fresh session.
            setattr(ReconnectingRDBStorage, name, retried(method, "search store (Optuna)", reset=fresh_session))
    ReconnectingRDBStorage.__module__, ReconnectingRDBStorage.__qualname__ = __name__, "ReconnectingRDBStorage"
    return ReconnectingRDBStorage


ReconnectingRDBStorage = _reconnecting_rdb_storage()


def client(uri: str) -> RetryingClient:
    return RetryingClient(uri)


def normalize_store(uri: str) -> str:
    """A relative SQLite path made absolute (so `resume` and `status` work from any folder), and a
    bare postgresql:// given the psycopg 3 driver we install (SQLAlchemy's default is psycopg2)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    if uri.startswith("postgresql://"):
        return "postgresql+psycopg://" + uri[len("postgresql://"):]
    return uri


def unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be made or written (judged by its nearest existing ancestor), or None."""
    existing = folder.resolve()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not a writable folder"
    try:  # root passes os.access everywhere, /proc and a root-squashed NFS mount included
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        return f"{existing} is not a writable folder ({e.strerror.lower()})"
    return None


def check_store(uri: str, timeout_s: float = 5.0, server_timeout_s: float = 30.0) -> None:
    """Fail fast, before anything launches, if the tracking store cannot be reached. A server that
    refuses the connection fails at once; one that answers slowly gets `server_timeout_s`: a team
    server checking a password hash on loaded cores took over 5 s to answer, and a launch its
    MLflow client (which waits 120 s a request) would have tracked was refused."""
    uri = reveal(uri)
    found = _CREDENTIALS.match(uri)
    if found and "@" in uri[found.end():].split("/", 1)[0]:
        # A driver ends the password at its first @ and takes the rest for the host, which its
        # errors then print; redact (and so what is stored) would leave that rest in view too.
        raise TrackingError(f"{redact_secrets(uri)}: its password holds an @, which ends it where a driver reads it: write the @ as %40")
    if uri.startswith("sqlite:///"):
        file = Path(uri[len("sqlite:///"):]).resolve()
        if file.exists():
            if not file.is_file():
                raise TrackingError(f"{file} is a folder, not a SQLite file (name the file: sqlite:///{file}/mlflow.db)")
            with open(file, "rb") as f:
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise TrackingError(f"{file} is not a SQLite database")
            if not os.access(file, os.R_OK | os.W_OK):
                raise TrackingError(f"{file} is not readable and writable by this user")
            return
        problem = unwritable(file.parent)
        if problem:  # the folder itself is made at launch, once everything has been checked
            raise TrackingError(f"cannot create the SQLite store in {file.parent}: {problem}")
        return
    if uri.startswith(("http://", "https://")):
        import urllib.request

        import urllib.error

        # Not /health, which MLflow exempts from its host check and its authentication: an API
        # call, with the credentials MLflow's client sends (from the environment, else the URL's
        # user:password@, which urllib would take for part of the host name), answers as a launch's will.
        bare, from_environment = without_userinfo(uri), auth_headers()
        request = urllib.request.Request(bare.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default",
                                         headers=from_environment or url_auth_headers(uri))
        try:
            urllib.request.urlopen(request, timeout=server_timeout_s).read()
        except urllib.error.HTTPError as e:
            if e.code != 404:  # 404: no such experiment, but the server answered
                answer = " ".join(e.read().decode(errors="replace").strip().splitlines()[:1])
                if e.code == 401:
                    answer += (" (credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD were refused)" if from_environment else
                               " (the URI's user and password were refused)" if url_auth_headers(uri) else
                               " (it asks for credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)")
                raise TrackingError(f"tracking server {redact(uri)} refuses requests: {e.code} {answer}") from None
        except OSError as e:
            raise TrackingError(f"cannot reach tracking server {redact(uri)}: {getattr(e, 'reason', e)}") from None
        return
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": int(timeout_s)})
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as e:  # driver errors differ per database; all mean "unreachable"
        first_line = str(getattr(e, "orig", e)).strip().splitlines()[0]
        raise TrackingError(f"cannot reach {redact(uri)}: {first_line}") from None


def without_userinfo(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def url_auth_headers(uri: str) -> dict[str, str]:
    """Basic auth from an http(s) URI's user:password@, as MLflow's client (requests) sends it."""
    import base64

    parts = urllib.parse.urlsplit(uri)
    if parts.username is None:
        return {}
    user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
    return {"Authorization": "Basic " + base64.b64encode(basic_credentials(user, password)).decode()}


def basic_credentials(user: str, password: str) -> bytes:
    """user:password as requests (MLflow's client) encodes it for basic auth: latin-1 where it can."""
    try:
        return f"{user}:{password}".encode("latin-1")
    except UnicodeEncodeError:
        return f"{user}:{password}".encode()


def auth_headers() -> dict[str, str]:
    """The Authorization header MLflow's client sends a tracking server, from the same variables:
    a token (MLFLOW_TRACKING_TOKEN) or basic auth (MLFLOW_TRACKING_USERNAME / _PASSWORD)."""
    import base64

    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(basic_credentials(user, password)).decode()}
    return {}


def search_store(uri: str, launch_dir: Path, create: bool = True) -> tuple[str, dict]:
    """Where the Optuna study of a launch lives: in SQL beside the MLflow runs, so the search's
    history survives a driver crash independently of Tune's checkpoint. Returns a SQLAlchemy URL and
    engine arguments. Optuna and MLflow both keep an `alembic_version` table, so they cannot share
    one schema: PostgreSQL gets a schema `optuna` in the same database, SQLite a sibling file
    (`mlflow.db` -> `mlflow.optuna.db`); other stores (an http:// server) a file in the launch folder."""
    if uri.startswith("postgresql"):
        import sqlalchemy

        if create:  # needs CREATE on the database even where the schema exists
            engine = sqlalchemy.create_engine(uri)
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("CREATE SCHEMA IF NOT EXISTS optuna"))
            engine.dispose()
        # pre-ping: a connection the server dropped is replaced at checkout, not used and failed.
        return uri, {"connect_args": {"options": "-csearch_path=optuna"}, "pool_pre_ping": True}
    if uri.startswith("sqlite:///"):
        return os.path.splitext(uri)[0] + ".optuna.db", {}
    return f"sqlite:///{launch_dir.resolve() / 'optuna.db'}", {}


@functools.lru_cache(maxsize=1)  # one git call per driver, not two per trial
def git_state() -> tuple[str, bool]:
    """(the full commit of this checkout, whether tracked files differ from it); ("", False) outside git."""
    root = Path(__file__).resolve().parents[2]  # the checkout: orchestrator/record/ is two below it
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "", False
    return sha, bool(dirty)


def code_tags() -> dict[str, str]:
    """`code_version` (short commit, -dirty when tracked files changed) and MLflow's own git tag,
    which its UI shows and links; `data_version`, the task generators' (a launch compared with one
    on other data says so)."""
    data = {DATA_VERSION_TAG: str(GENERATOR_VERSION)}
    sha, dirty = git_state()
    if not sha:
        return {"code_version": "unknown", **data}
    return {"code_version": sha[:7] + ("-dirty" if dirty else ""), "mlflow.source.git.commit": sha, **data}


def warm_up(uri: str) -> None:
    """MLflow's imports and, where the store exists, a first read; nothing written, so a launch
    refused after this (its storage unseen by a node) leaves no store behind."""
    importlib.import_module("mlflow.store.tracking.sqlalchemy_store")  # seconds of imports

    if store_exists(uri):
        client(uri).search_experiments(max_results=1)


def artifact_root(uri: str, records: Path) -> str | None:
    """Where a new experiment keeps its artifacts (each launch's report): beside a SQLite store
    (`<folder>/mlartifacts`); for a database reached directly (PostgreSQL) beside the launch folders
    (`<records>/mlartifacts`), where MLflow's own default is ./mlruns of whatever folder the
    experiment's first launch ran in; a tracking server's own (`--artifacts-destination`)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    if urllib.parse.urlsplit(uri).scheme in ("http", "https"):
        return None
    return (records.resolve() / "mlartifacts").as_uri()


def open_launch(uri: str, experiment: str, launch_id: str, spec_file: str, spec_text: str, records: Path) -> str:
    """The launch's parent run: found by its launch_id tag when resuming, else created. Returns its
    id. `records`: the folder of the launch folders (the file's storage_path; see artifact_root)."""
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else mlflow.create_experiment(experiment, artifact_location=artifact_root(uri, records))
    found = mlflow.search_runs([exp_id], filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'launch'")
    if found:
        mlflow.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    run = mlflow.create_run(exp_id, run_name=launch_id, tags={
        "launch_id": launch_id, "kind": "launch", "spec_file": spec_file, **code_tags(), "driver_host": socket.gethostname(),
    })
    try:
        mlflow.log_text(run.info.run_id, spec_text, "search_space.yaml")
    except BaseException:
        # An artifact store that cannot be written left a run RUNNING for good, and its retry one
        # without the file: this one goes to MLflow's deleted runs, and the retry makes a whole one.
        with contextlib.suppress(Exception):
            mlflow.delete_run(run.info.run_id)
        raise
    return run.info.run_id


def running_launch_runs(uri: str, experiment: str, driver_host: str) -> list:
    """The launch runs of `experiment` that MLflow shows running and whose driver was on `driver_host`."""
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return list(mlflow.search_runs([exp.experiment_id], filter_string=f"tags.kind = 'launch' and attributes.status = 'RUNNING' and "
                                                                      f"tags.driver_host = '{driver_host}'", max_results=1000))


def metric_name(*parts: str) -> str:
    """An MLflow metric name from parts joined by '/': '=' becomes ':', and whatever else MLflow
    refuses in names (commas, brackets) is dropped."""
    return re.sub(r"[^\w.\- :/]", "", "/".join(parts).replace("=", ":"))


def pair_run(mlflow, exp_id: str, parent_run_id: str, launch_id: str, pair: str, tags: dict | None = None) -> str:
    """The run of `pair` in a launch, nested under the launch's run, and the parent of the pair's
    trial runs (MLflow's table then groups launch > pair > trials): found by its tags, else created."""
    found = mlflow.search_runs([exp_id], filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'pair' and tags.pair = '{pair}'")
    if found:
        return found[0].info.run_id
    return mlflow.create_run(exp_id, run_name=pair, tags={
        "mlflow.parentRunId": parent_run_id, "launch_id": launch_id, "kind": "pair", "pair": pair, **(tags or {}), **code_tags()}).info.run_id


def summarize_pairs(uri: str, parent_run_id: str, launch_id: str, metric: str, score: str, summaries: dict[str, dict]) -> None:
    """A search's answer (`summaries`: pair_summaries) where MLflow's runs table shows it at a glance: on the launch's run, each
    pair's best `metric` and that trial's test score, and the confirmed means where the search was
    confirmed; and a run per pair, nested under the launch's, holding the same metrics and the
    answer's config (the confirmed candidate's, else the best trial's) as params."""
    from mlflow.entities import Metric, Param

    mlflow = client(uri)
    exp_id = mlflow.get_run(parent_run_id).info.experiment_id
    now = int(time.time() * 1000)
    on_parent = []
    for pair, summary in sorted(summaries.items()):
        if summary["best"] is None:
            continue
        values = {metric: summary["best"], **({f"test_{score}_at_best": summary["test"]} if summary.get("test") is not None else {})}
        confirmed = summary.get("confirmed") or {}
        values.update({f"confirmed_{metric}": confirmed.get("metric"), f"confirmed_test_{score}": confirmed.get("test"),
                       f"confirmed_test_{score}_std": confirmed.get("test_std")})
        values = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
        on_parent += [Metric(metric_name(pair, k), v, now, 0) for k, v in values.items()]
        run_id = pair_run(mlflow, exp_id, parent_run_id, launch_id, pair)
        answer = confirmed.get("config") or summary["best_config"]  # the confirmed candidate's, where there is one
        params = [Param(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v)) for k, v in sorted(answer.items())]
        for start in range(0, len(params), 100):
            mlflow.log_batch(run_id, params=params[start : start + 100])
        mlflow.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])
        mlflow.set_tag(run_id, "best_run", summary["best_run"])
        mlflow.set_terminated(run_id)
    for start in range(0, len(on_parent), MAX_BATCH):
        mlflow.log_batch(parent_run_id, metrics=on_parent[start : start + MAX_BATCH])


def close_launch(uri: str, parent_run_id: str, status: str = "FINISHED", launch_status: str = "finished") -> None:
    """The launch's run and its pair runs ended with `status`."""
    mlflow = client(uri)
    mlflow.set_tag(parent_run_id, "launch_status", launch_status)
    launch = mlflow.get_run(parent_run_id)
    pairs = mlflow.search_runs([launch.info.experiment_id], filter_string=f"tags.launch_id = '{launch.data.tags['launch_id']}' and tags.kind = 'pair'")
    for run_id in [run.info.run_id for run in pairs] + [parent_run_id]:
        mlflow.set_terminated(run_id, status=status)


def cell_name(setting: dict) -> str:
    """An ablation cell's `cell` tag: its grid values ("n_layers=4 lr=0.001"), "-" for seeds only."""
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "-"


def cell_order(name: str) -> tuple:
    """A `cell` tag's sort key: its values as numbers where they are ("n_layers=10" after "n_layers=8")."""
    key = []
    for part in name.split():
        value = part.partition("=")[2]
        try:
            key.append((0, float(value), ""))
        except ValueError:
            key.append((1, 0.0, value))
    return tuple(key)


def member_key(member: int, key: str) -> str:
    """Where a trial of stacked members puts one member's metric in its Tune result."""
    return f"member{member}/{key}"


def member_result(result: dict[str, Any], member: int | None) -> dict[str, Any]:
    """One member's result within a trial's: its own `member<k>/` keys over the trial's shared ones
    (node, device, Tune's bookkeeping); a trial of one run's result as it is. A key that members
    report themselves is no shared one: the trial's value of it is the stack's (its best member's
    score, for ASHA), and a member that diverged before its first evaluation has no score, not that."""
    if member is None:
        return result
    prefix = member_key(member, "")
    per_member = {k: k.split("/", 1) for k in result if re.match(r"member\d+/", k)}
    members_own = {key for _, key in per_member.values()}
    return {**{k: v for k, v in result.items() if k not in per_member and k not in members_own},
            **{k[len(prefix):]: v for k, v in result.items() if k.startswith(prefix)}}


# Every score of every task kind (a metric is "<split>_<score>" or ends in a checkpoint's suffix).
METRIC_SUFFIXES = (*dict.fromkeys(f"_{score}" for scores in SCORES_OF_KIND.values() for score in scores), "_at_best", "_final", "_early")


def numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The training protocol's metrics in a Tune result (Tune adds bookkeeping keys we leave out)."""
    return {
        k: float(v) for k, v in result.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        and (k.endswith(METRIC_SUFFIXES) or k in ("loss", "best_iteration", "steps_per_s", "gpu_memory_mib", "time_total_s"))
    }


def launch_trial_runs(uri: str, experiment: str, launch_id: str) -> list:
    """Every trial run of a launch, all pages, in the order they started: where trials tie on the
    selection metric, the first best in this order answers (the earliest, as Optuna's
    study.best_trial takes the first of its tied trials), whatever order the store returns."""
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs, token = [], None
    while True:
        page = mlflow.search_runs([exp.experiment_id], filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'trial'", max_results=1000,
                                  order_by=["attributes.start_time ASC", "attributes.run_id ASC"], page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def missing_sqlite_file(uri: str) -> str | None:
    """The database file a SQLite URI names, where it does not exist (opening it would create it)."""
    path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    return path if path is not None and not Path(path).is_file() else None


def damaged_store(error: BaseException) -> str | None:
    """SQLite's own word where `error` comes of a database file that is not one or is cut short
    ("file is not a database", "database disk image is malformed"), else None. Its subclasses
    (a locked or unreachable database) are other faults."""
    import sqlite3

    seen = error
    while seen is not None:
        if type(seen) is sqlite3.DatabaseError:
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def store_exists(uri: str) -> bool:
    """Whether the store exists and holds MLflow's tables: opening one that does not would create them."""
    uri = reveal(uri)
    if uri.startswith(("http://", "https://")):
        return True  # a tracking server's database is its own business
    if missing_sqlite_file(uri):
        return False  # SQLite would create the file
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    try:
        return retried(lambda: sqlalchemy.inspect(engine).has_table("experiments"), f"tracking store {redact(uri)}")()
    finally:
        engine.dispose()


def step_rates(uri: str, limit: int = 5000) -> list[dict]:
    """The training steps/s of the store's latest `limit` trial runs, each with its model, task and
    device kind (cpu, cuda): what a dry run without calibration estimates from. A stacked run's is
    its share of the stack's member-steps/s (the stack's steps/s, which each member logs, times its
    members), the cost of one run whether or not it stacks. A read only: a store that does not
    exist yet, or has no tables yet, stays so."""
    if not store_exists(uri):
        return []
    mlflow = client(uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    if not experiments:
        return []
    runs = mlflow.search_runs(experiments, filter_string="tags.kind = 'trial' and metrics.steps_per_s > 0",
                              order_by=["attributes.start_time DESC"], max_results=limit)
    members: dict[str, int] = {}
    for r in runs:
        if "member" in r.data.tags:
            members[r.data.tags.get("trial_id", "")] = members.get(r.data.tags.get("trial_id", ""), 0) + 1
    return [{"model": r.data.tags.get("model"), "task": r.data.tags.get("task"), "device": r.data.tags.get("device", "").split(":")[0],
             "rate": r.data.metrics["steps_per_s"] * (members[r.data.tags.get("trial_id", "")] if "member" in r.data.tags else 1)}
            for r in runs]


def end_running_runs(mlflow, experiment_id: str, launch_id: str, status_of, skip: set[str] = frozenset()) -> None:
    """Every trial run of a launch still "running" (its trial not in `skip`) when the launch's
    driver stops: tagged status_of(its trial id) and KILLED."""
    stale = mlflow.search_runs([experiment_id], filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'trial' and "
                                                             f"tags.{STATUS_TAG} = 'running'", max_results=10_000)
    for run in stale:
        trial_id = run.data.tags.get("trial_id")
        if trial_id not in skip:
            mlflow.set_tag(run.info.run_id, STATUS_TAG, status_of(trial_id))
            mlflow.set_terminated(run.info.run_id, status="KILLED")


def interrupt_launch(uri: str, experiment: str, parent_run_id: str, launch_id: str) -> None:
    """The records of a launch whose driver was stopped: its running trial runs interrupted, its
    own run and its pairs' KILLED (resume marks them running again)."""
    mlflow = client(uri)
    end_running_runs(mlflow, mlflow.get_experiment_by_name(experiment).experiment_id, launch_id, lambda _: "interrupted")
    close_launch(uri, parent_run_id, status="KILLED", launch_status="interrupted")


def ended_runs(uri: str, experiment: str, launch_id: str, phase: str) -> int:
    """How many runs of a launch's phase ("search" or "confirm") have ended (completed, stopped
    early, diverged or failed): a trial of stacked members counts once per member."""
    return sum(1 for run in launch_trial_runs(uri, experiment, launch_id)
               if run.data.tags.get("phase", "search") == phase and status_kind(run) not in (None, "running"))


def status_kind(run) -> str | None:
    """How `status` counts a trial run: done, stopped (early, by ASHA), running or failed; None for
    a run lost on resume (another trial replaced it)."""
    return kind_of(run.data.tags.get(STATUS_TAG, "running"))


def kind_of(status: str) -> str | None:
    if status == "lost":
        return None
    return {"running": "running", "interrupted": "running", "failed": "failed", "diverged": "failed", "early_stopped": "stopped"}.get(status, "done")


ANSWERING = ("done", "running")  # the kinds a pair's answer may be of: see may_answer


def may_answer(status: str) -> bool:
    """Whether a search trial of this status may be the pair's answer: one that diverged or failed
    is not (its config would not train again), nor one ASHA stopped (scored on less training)."""
    return kind_of(status) in ANSWERING


def cell_summaries(uri: str, experiment: str, launch_id: str, metric: str, score: str) -> dict[str, dict[str, dict]]:
    """An ablation's progress per pair and grid cell (its runs' `cell` tag): seed runs done,
    running and failed (and of those, diverged), and the done ones' `metric` and test_<score>_at_best values."""
    out: dict[str, dict[str, dict]] = {}
    for run in launch_trial_runs(uri, experiment, launch_id):
        kind = status_kind(run)
        if kind is None:
            continue
        cells = out.setdefault(run.data.tags.get("pair", "?"), {})
        cell = cells.setdefault(run.data.tags.get("cell", "-"), {"done": 0, "stopped": 0, "running": 0, "failed": 0, "metric": [], "test": []})
        cell[kind] += 1
        if run.data.tags.get(STATUS_TAG) == "diverged":  # of those failed
            cell["diverged"] = cell.get("diverged", 0) + 1
        if kind == "done":
            for key, name in (("metric", metric), ("test", f"test_{score}_at_best")):
                if name in run.data.metrics:
                    cell[key].append(run.data.metrics[name])
    return out


def pair_summaries(uri: str, experiment: str, launch_id: str, metric: str, score: str, runs: list | None = None) -> dict[str, dict]:
    """Per pair: search trial counts by status, the best trial so far by `metric` and its test
    score (from MLflow, the source of truth), and, where the search was confirmed, `confirmed`
    (see confirmed_candidates). `runs`: the launch's trial runs, where already read."""
    lower_is_better = score in LOWER_IS_BETTER
    out: dict[str, dict] = {}
    runs = launch_trial_runs(uri, experiment, launch_id) if runs is None else runs
    for run in runs:
        if run.data.tags.get("phase") == "confirm":
            continue
        pair = run.data.tags.get("pair", "?")
        entry = out.setdefault(pair, {"done": 0, "stopped": 0, "running": 0, "failed": 0, "best": None, "best_run": None, "best_config": None})
        kind = status_kind(run)
        if kind is None:
            continue
        entry[kind] += 1
        if run.data.tags.get(STATUS_TAG) == "diverged":  # of those failed: its hyperparameters, not the cluster
            entry["diverged"] = entry.get("diverged", 0) + 1
        value = run.data.metrics.get(metric)
        if value is not None and kind in ANSWERING and (entry["best"] is None or (value < entry["best"] if lower_is_better else value > entry["best"])):
            entry.update(best=value, best_run=run.info.run_id, best_config=json.loads(run.data.tags.get(CONFIG_TAG, "{}")),
                         test=run.data.metrics.get(f"test_{score}_at_best"), best_metrics=dict(run.data.metrics))
    for pair, confirmed in confirmed_candidates(runs, metric, score).items():
        out.setdefault(pair, {"done": 0, "stopped": 0, "running": 0, "failed": 0, "best": None, "best_run": None, "best_config": None})
        out[pair]["confirmed"] = confirmed
    return out


def failed_text(summary: dict) -> str:
    """A pair summary's failed trials in words: "3 failed, 2 of them diverged"."""
    return f"{summary.get('failed', 0)} failed" + (f", {summary['diverged']} of them diverged" if summary.get("diverged") else "")


def confirmed_candidates(runs, metric: str, score: str) -> dict[str, dict]:
    """Per pair, from its confirmation runs that ended: the candidate with the most seeds completed
    (one whose seeds diverge is no answer, however well its one lucky seed scored) and of those
    the best mean `metric`, with n (its completed seeds) of `seeds`, the mean and sample std of its
    test score, and its config (without a seed). The pair's answer, where the search was confirmed."""
    import statistics

    sign = 1 if score in LOWER_IS_BETTER else -1
    grouped: dict[str, dict[str, list]] = {}
    running: dict[str, int] = {}  # a confirmation under way: its answer so far may change
    for run in runs:
        if run.data.tags.get("phase") == "confirm" and run.data.tags.get(STATUS_TAG) == "running":
            running[run.data.tags["pair"]] = running.get(run.data.tags["pair"], 0) + 1
        if run.data.tags.get("phase") != "confirm" or run.data.tags.get(STATUS_TAG) not in ENDED:
            continue
        grouped.setdefault(run.data.tags["pair"], {}).setdefault(run.data.tags["candidate"], []).append(run)
    out = {}
    for pair, candidates in grouped.items():
        done = {k: [r for r in ended if r.data.tags[STATUS_TAG] == "completed"] for k, ended in candidates.items()}
        done = {k: completed for k, completed in done.items() if completed}
        if not done:
            continue

        def mean_metric(k: str) -> float:
            return statistics.fmean(r.data.metrics.get(metric, math.nan) for r in done[k])

        chosen = min(done, key=lambda k: (-len(done[k]), sign * mean_metric(k)))
        config = {k: v for k, v in json.loads(done[chosen][0].data.tags.get(CONFIG_TAG, "{}")).items() if k != "seed"}
        # every test split's score of each seed: the launch's answer compares the pairs on its headline split
        splits = {name: [r.data.metrics[name] for r in done[chosen] if name in r.data.metrics]
                  for name in sorted({m for r in done[chosen] for m in r.data.metrics if m.startswith("test") and m.endswith("_at_best")})}
        tests = splits.get(f"test_{score}_at_best", [])
        out[pair] = {"candidate": int(chosen), "n": len(done[chosen]), "seeds": len(candidates[chosen]), "metric": mean_metric(chosen),
                     "config": config, "test": statistics.fmean(tests) if tests else None,
                     "test_std": statistics.stdev(tests) if len(tests) > 1 else None, "running": running.get(pair, 0), "splits": splits}
    return out


def confirmed_text(confirmed: dict | None) -> str:
    """A confirmed answer in words: the chosen candidate's test mean ± std over its seeds."""
    if not confirmed or confirmed.get("test") is None:
        return ""
    spread = f" ± {confirmed['test_std']:.3f}" if confirmed.get("test_std") is not None else ""
    of = f" of {confirmed['seeds']}" if confirmed.get("seeds", confirmed["n"]) != confirmed["n"] else ""
    so_far = f"; so far: {confirmed['running']} confirmation run(s) still running" if confirmed.get("running") else ""
    return f"confirmed {confirmed['test']:.3f}{spread} over {confirmed['n']}{of} seeds (candidate {confirmed['candidate'] + 1}{so_far})"


def top_configs(uri: str, experiment: str, launch_id: str, metric: str, score: str, k: int) -> dict[str, list[dict]]:
    """Per pair, the full configs (seed left out) of its k best completed search trials, best first:
    what a confirmation trains again. Trials ASHA stopped early or that diverged are no candidates."""
    lower_is_better = score in LOWER_IS_BETTER
    found: dict[str, list] = {}
    for run in launch_trial_runs(uri, experiment, launch_id):
        if run.data.tags.get("phase") == "confirm" or run.data.tags.get(STATUS_TAG) != "completed" or metric not in run.data.metrics:
            continue
        found.setdefault(run.data.tags["pair"], []).append((run.data.metrics[metric], json.loads(run.data.tags[CONFIG_TAG])))
    return {pair: [{key: v for key, v in config.items() if key != "seed"}
                   for _, config in sorted(entries, key=lambda e: e[0], reverse=not lower_is_better)[:k]]
            for pair, entries in found.items()}


def ui_links(ui: str, experiment_id: str, run_ids: list[str], metrics: list[str], runs_filter: str, order_by: str, mode: str) -> dict[str, str]:
    """Links into MLflow's UI at `ui` (e.g. `mlflow ui`'s http://127.0.0.1:5000) for a group of
    runs: `runs`, the experiment's runs table filtered by `runs_filter` and sorted by the metric
    `order_by`, best first (flat, not under their collapsed parent runs); `compare`, MLflow's
    comparison page (params and metrics side by side, parallel coordinates, scatter and contour
    plots); and `curves`, their `metrics` against steps, one line per run."""
    from urllib.parse import quote, urlencode

    def q(value) -> str:
        return quote(json.dumps(value, separators=(",", ":")), safe="")

    runs, experiments = q(run_ids), q([experiment_id])
    base = ui.rstrip("/") + "/#/"
    table = urlencode({"searchFilter": runs_filter, "orderByKey": f"metrics.`{order_by}`", "orderByAsc": str(mode == "min").lower()})
    return {"runs": f"{base}experiments/{experiment_id}/runs?{table}",
            "compare": f"{base}compare-runs?runs={runs}&experiments={experiments}",
            "curves": (f"{base}metric/?runs={runs}&metric={q(metrics[0])}&experiments={experiments}&plot_metric_keys={q(metrics)}"
                       "&plot_layout=%7B%7D&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=true&deselected_curves=%5B%5D"
                       "&last_linear_y_axis_range=%5B%5D")}
