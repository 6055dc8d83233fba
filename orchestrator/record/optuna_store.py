"""The Optuna storage of a launch's searches: where it lives, its calls retried while the database
is unreachable, and the read-only view the dashboard gets."""

from __future__ import annotations

import abc
import copy
import os
import threading
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from .retries import retried
from .secrets import redact
from .stores import TrackingError, missing_sqlite_file, reveal, schema_lock

WHAT = "search store (Optuna)"
READ_ONLY = "this dashboard is read-only: the launch's studies change only through the launch"


def search_store(uri: str, launch_dir: Path, create: bool = True) -> tuple[str, dict]:
    """Where the Optuna study of a launch lives: in SQL beside the MLflow runs, so the search's
    history survives a driver crash independently of Tune's checkpoint. Returns a SQLAlchemy URL and
    engine arguments. Optuna and MLflow both keep an `alembic_version` table, so they cannot share
    one schema: PostgreSQL gets a schema `optuna` in the same database, SQLite a sibling file
    (`mlflow.db` -> `mlflow.optuna.db`); other stores (an http:// server) a file in the launch folder."""
    if uri.startswith("postgresql"):
        if create:  # needs CREATE on the database even where the schema exists
            # here, not at the top: half a second that every trial worker importing this module would pay
            import sqlalchemy  # noqa: PLC0415

            engine = sqlalchemy.create_engine(uri)
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("CREATE SCHEMA IF NOT EXISTS optuna"))
            engine.dispose()
        # pre-ping: a connection the server dropped is replaced at checkout, not used and failed.
        return uri, {"connect_args": {"options": "-csearch_path=optuna"}, "pool_pre_ping": True}
    if uri.startswith("sqlite:///"):
        return os.path.splitext(uri)[0] + ".optuna.db", {}
    return f"sqlite:///{launch_dir.resolve() / 'optuna.db'}", {}


def search_storage(uri: str, launch_dir: Path, read_only: bool = False):
    """The Optuna storage of a launch (see search_store), its calls retried like MLflow's.
    `read_only`: for the commands that only read a launch's studies (dashboard, report), which a
    team may give a role that can create nothing: no schema is created (Optuna creates its tables
    only where they are missing, so none there either)."""
    what, revealed = WHAT, reveal(uri)
    # PostgreSQL's optuna schema is made in search_store, under the lock too
    with schema_lock(
        revealed
        if revealed.startswith("postgresql")
        else search_store(revealed, launch_dir, create=False)[0],
        "optuna",
        what,
    ):
        url, engine_kwargs = retried(search_store, what)(revealed, launch_dir, create=not read_only)
        if read_only and missing_sqlite_file(url):  # opening it would create an empty one, of no studies
            raise TrackingError(
                f"no search store (Optuna) at {missing_sqlite_file(url)}: "
                "the launch's studies were kept there"
            )
        return retried(RetryingStorage, what)(url, engine_kwargs=engine_kwargs)


def fresh_session(storage, *args, **kwargs) -> None:
    """Discard `storage`'s (an Optuna RDBStorage) thread's session: the next call opens another."""
    try:
        storage.scoped_session.remove()
    except Exception:
        pass  # closing a session on a dead connection may fail; it is discarded anyway


def read_only_view(storage, study_names: set[str]):
    """`storage` as the dashboard may see it: the named studies only (a search store holds every
    launch's and every experiment's), and no write (optuna-dashboard can create, rename and delete
    studies and tell trials; `read_only` of search_storage only spares the schema). Reads go to the
    live storage, so a running launch's trials appear as they finish."""

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
                if any(
                    t._trial_id == trial_id for t in storage.get_all_trials(study._study_id, deepcopy=False)
                ):
                    return storage.get_trial(trial_id)
            raise KeyError(f"no trial with id {trial_id}")

    def refuse(self, *args, **kwargs):
        raise optuna.exceptions.StorageInternalError(READ_ONLY)

    for name in BaseStorage.__abstractmethods__ - set(vars(ReadOnlyStudies)):  # every write
        setattr(ReadOnlyStudies, name, refuse)
    abc.update_abstractmethods(ReadOnlyStudies)
    return ReadOnlyStudies()


# The storage API (BaseStorage's public methods) as RDBStorage implements it, each call in a
# session of its own: retried whole, in a fresh session. Not here: BaseStorage's own methods, which
# call these (get_n_trials, get_trial_params, get_trial_number_from_id); the schema's, which a
# launch never calls (get_current_version, upgrade); and those without a query (remove_session).
SESSION_METHODS = (
    "create_new_study",
    "delete_study",
    "get_all_studies",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "set_study_user_attr",
    "set_study_system_attr",
    "create_new_trial",
    "get_trial",
    "get_all_trials",
    "get_best_trial",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_param",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "set_trial_param",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
)


# Past this many trials to read one by one (those unfinished at the last read, and the new ones),
# one query for the whole study is cheaper.
READ_ONE_BY_ONE = 64
UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)


class RetryingStorage(BaseStorage):
    """Optuna's SQL storage (an RDBStorage) behind Optuna's public storage API, each call retried in
    a fresh session while the database is unreachable: a connection the server dropped mid-call is
    replaced (pool_pre_ping covers idle ones). A wrapper, not a subclass: Optuna puts its own cache
    around an RDBStorage, which calls RDBStorage's private methods, so retrying the public ones of a
    subclass would leave a running search's own calls unretried.

    The cache is ours (docs/design/architecture.md#the-search-store): a finished trial never changes
    (Optuna refuses to update one), so each is read once; a study's trials are read again only where
    they were unfinished at the last read, or are new. A suggestion then reads a few trials, not the
    whole study, and stays right when other drivers add trials to the same study."""

    def __init__(self, url: str, engine_kwargs: dict | None = None):
        self.url, self.engine_kwargs = url, engine_kwargs or {}
        self.rdb = RDBStorage(url, engine_kwargs=self.engine_kwargs)  # it creates its tables where missing
        self.finished: dict[int, dict[int, FrozenTrial]] = {}  # study id -> trial number -> trial
        self.counted: dict[int, int] = {}  # study id -> how many trials it had at the last read
        self.lock = threading.Lock()  # the dashboard's server threads share one storage

    def __getstate__(self):  # Tune pickles the searcher, and with it this storage: no password
        return {"url": redact(self.url), "engine_kwargs": self.engine_kwargs}

    def __setstate__(self, state):
        # Unpickled as Tune restores the searcher, where it connects: the database may be down then.
        retried(self.__init__, WHAT)(reveal(state["url"]), state["engine_kwargs"])

    def fresh_session(self, *args, **kwargs) -> None:
        fresh_session(self.rdb)

    def call(self, name: str):
        # A session whose connection dropped mid-transaction refuses every later call until it is
        # rolled back, which a dead connection cannot do: retry with a fresh session.
        return retried(getattr(self.rdb, name), WHAT, reset=self.fresh_session)

    def get_all_trials(self, study_id, deepcopy=True, states=None):
        if states is not None and not any(state.is_finished() for state in states):
            # None of them is cached: asked for alone (Optuna asks for the waiting ones at every
            # suggestion, and a study seldom has any), they are one short query.
            return self.call("get_all_trials")(study_id, deepcopy=deepcopy, states=states)
        with self.lock:
            trials = self.read_trials(study_id)
        trials = [t for t in trials if states is None or t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def delete_study(self, study_id):
        with self.lock:
            self.finished.pop(study_id, None)
            self.counted.pop(study_id, None)
        return self.call("delete_study")(study_id)

    def read_trials(self, study_id) -> list[FrozenTrial]:
        """Every trial of the study, by number: the finished ones from the cache."""
        finished = self.finished.setdefault(study_id, {})
        counted = self.counted.get(study_id, 0)
        again = [number for number in range(counted) if number not in finished]
        found = self.read_since(study_id, again, counted) if counted else None
        if found is None:
            found = self.call("get_all_trials")(study_id, deepcopy=False)
        finished.update({t.number: t for t in found if t.state.is_finished()})
        unfinished = {t.number: t for t in found if not t.state.is_finished()}
        self.counted[study_id] = max(counted, len(finished) + len(unfinished))
        return sorted([*finished.values(), *unfinished.values()], key=lambda t: t.number)

    def read_since(self, study_id, again: list[int], counted: int) -> list[FrozenTrial] | None:
        """The trials numbered `again` (unfinished at the last read) and those from `counted` on: the
        unfinished ones in one query, those that finished since one by one; None where those are
        more than READ_ONE_BY_ONE (the whole study in one query is cheaper then)."""
        unfinished = self.call("get_all_trials")(study_id, deepcopy=False, states=UNFINISHED)
        known = {t.number for t in unfinished}
        after = max(counted, max(known, default=-1) + 1)
        ended = [n for n in [*again, *range(counted, after)] if n not in known]
        if len(ended) > READ_ONE_BY_ONE:
            return None
        number_id = self.call("get_trial_id_from_study_id_trial_number")
        ids = [number_id(study_id, number) for number in ended]
        while len(ids) <= READ_ONE_BY_ONE:
            try:
                ids.append(number_id(study_id, after))
            except KeyError:  # no trial of that number yet
                return [*unfinished, *(self.call("get_trial")(trial_id) for trial_id in ids)]
            after += 1
        return None


def _retrying(name: str):
    def call(self, *args, **kwargs):
        return self.call(name)(*args, **kwargs)

    call.__name__ = name
    return call


for _name in set(SESSION_METHODS) - set(vars(RetryingStorage)):
    setattr(RetryingStorage, _name, _retrying(_name))
abc.update_abstractmethods(RetryingStorage)
