"""Ray for a launch's driver: joining a cluster (or starting a local instance), and a console that
shows our lines rather than Ray's, Tune's and Optuna's restatements of them.
"""

from __future__ import annotations

import logging
import os

import optuna
import ray

from ..record.retries import disk_full
from .cluster import join

try:  # Ray's forwarder of its processes' output (quiet_ray): private, so not in every Ray
    from ray._private.worker import global_worker_stdstream_dispatcher
except ImportError:
    global_worker_stdstream_dispatcher = None


def start_ray(address: str | None) -> bool:
    """Join `address` or start a local instance; returns whether the cluster has GPUs."""
    if not ray.is_initialized():
        # Ray's start-up lines (its token-authentication notice among them) say nothing a user acts on.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        if address:
            join(address, log_to_driver=True, logging_level=logging.WARNING)
            print(f"[launch] joined the Ray cluster at {address}", flush=True)
        else:
            # "local", not None: with no address Ray attaches to the last cluster `ray start` made
            # on this machine (/tmp/ray/ray_current_cluster), and waits for ever if that one died.
            join("local", include_dashboard=False, log_to_driver=True, logging_level=logging.WARNING)
            print("[launch] started a local Ray instance", flush=True)
        quiet_ray()
    return ray.cluster_resources().get("GPU", 0) > 0


def restated(record: logging.LogRecord) -> bool:
    """False for Tune's log records that restate what our lines say: a failed trial's traceback, the
    list of trials that failed for good at the run's end, and the previous checkpoint already gone
    when Tune deletes it (a driver killed as Tune pruned it; newest_existing_checkpoint copes)."""
    message = record.getMessage()
    if message.startswith(("Trial task failed", "Trials did not complete")):
        return False
    error = record.exc_info[1] if record.exc_info else None
    return not (
        "Error handling checkpoint" in message
        and isinstance(error, FileNotFoundError)
        and "checkpoint_" in str(error)
    )


def superseded_sync(record: logging.LogRecord) -> bool:
    """False for Tune's report of an upload of its experiment state that lost a file it was
    copying: Tune writes the next snapshot into its staging folder while the previous upload may
    still run (ray/tune/execution/experiment_state.py), and a temporary file of that write
    ("-tmp-searcher-state-...") is renamed under the upload. The snapshot after it is uploaded in
    full (the last one waits for its upload), so the lost copy costs nothing. False too for an
    upload that found the disk full: the launch stops on it in one line (disk.DiskWatch), and
    resume puts back what it cut short (disk.put_back_whole)."""
    error = record.exc_info[1] if record.exc_info else None
    return not (
        record.getMessage().startswith(
            ("Saving experiment state to storage", "Experiment state snapshotting")
        )
        and (isinstance(error, FileNotFoundError) and "-tmp-" in str(error) or disk_full(error) is not None)
    )


def uncollected(record: logging.LogRecord) -> bool:
    """False for Ray's "Unhandled error" of a trial's step that Tune, stopping (a full disk, an
    outage), no longer collected: the launch's stop line says why, and resume runs the step again."""
    message = record.getMessage()
    return not (message.startswith("Unhandled error") and "Trainable" in message)


def quiet_ray() -> None:
    """The console shows our lines, not Ray's restatement of a fault they already report: Tune's
    traceback of a failed trial (callbacks.error_words gives its last line; the whole one is in
    its MLflow run's error tag), and of what trial processes and Ray's own processes print (a
    dying node's "Failed to remove bundle", an interrupted worker's shutdown traceback), only
    our "[trial] ..." lines; the rest stays in Ray's log folder (<ray tmp>/session_latest/logs).
    Ray has no switch for its forwarding: its handlers are wrapped, where the installed Ray has them."""
    logging.getLogger("ray.tune.execution.tune_controller").addFilter(restated)
    logging.getLogger("ray.tune.tune").addFilter(restated)
    logging.getLogger("ray.tune.tune").addFilter(superseded_sync)
    logging.getLogger("ray.tune.execution.experiment_state").addFilter(superseded_sync)
    logging.getLogger("ray._private.worker").addFilter(uncollected)
    dispatcher = global_worker_stdstream_dispatcher
    if dispatcher is None:
        return

    def only_ours(forward):
        def handle(data):
            lines = [line for line in data.get("lines", []) if line.startswith("[trial]")]
            if lines:
                forward({**data, "lines": lines})

        return handle

    dispatcher.handlers = [
        (name, only_ours(handler)) for name, handler in getattr(dispatcher, "handlers", [])
    ]


def quiet_tune() -> None:
    """Tune's and Optuna's console as a launch's phases run: our lines instead of their tables,
    hints and notices of what our lines report or what recovered by itself."""
    # A snapshot after every checkpoint is what keeps resume exact; Tune warns about it each time.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's console (its boxes, tables and TensorBoard hint) off: callbacks.ProgressLines prints.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    # A restored experiment's trial that never reported has no result files; we read MLflow, not those.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # "The `process_trial_result` operation took 31 s": a store being retried, which [store] lines say.
    logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # "Falling back to a slower alternative" with the SQL of a dropped connection: it recovered.
    logging.getLogger("optuna.storages._rdb.storage").setLevel(logging.ERROR)
