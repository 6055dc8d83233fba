"""Joining the Ray cluster a launch names, shared by the launch and the dry run's cost. Cheap to
import: the CLI's entry point catches ClusterUnreachable for every command."""

from __future__ import annotations

import signal
import threading

from ..plan.storage import last_line


class ClusterUnreachable(RuntimeError):
    """Ray could not join the cluster at --address; refused (one line, exit 2) before anything is written."""


def join(address: str, **options) -> None:
    """ray.init at `address` ("local": a local instance of its own). Where Ray gives up on it with
    ConnectionError (a review saw one after about half a minute of retries, at a port that answered
    but was no Ray head's), one line, not its traceback. A port that accepts and never answers,
    or answers as another service, would keep ray.init waiting (past 300 s here):
    cli.launchable.check_address refuses it first."""
    import ray  # noqa: PLC0415 - ray takes seconds to import, and every command imports this module

    ours = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(address=address, **options)
    except ConnectionError as e:
        raise ClusterUnreachable(
            f"--address: Ray could not join a cluster at {address}: {last_line(e)}"
        ) from None
    finally:
        # ray.init makes SIGTERM a sys.exit(15), which skips the stop a Ctrl-C gets (the launch and its
        # pairs recorded interrupted, resumable): SIGTERM stays a Ctrl-C (cli.process.console).
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, ours)


def one_gpu() -> float:
    """A whole GPU, or all a node has where no node has one (a fraction declared to Ray): what a
    measurement on the joined cluster asks for, so that nothing beside it times it too."""
    import ray  # noqa: PLC0415 - as in join: seconds, for the commands that use Ray only

    return min(
        1, max((node["Resources"].get("GPU", 0) for node in ray.nodes() if node.get("Alive")), default=0)
    )


def measurement(function, **resources):
    """`function` as a Ray task holding `resources` (num_cpus, num_gpus, resources), declared in
    ray.remote itself: Ray runs a worker once (max_calls=1) only for a task declared there with
    GPUs. Given them through .options(), a measurement's worker stayed, holding its CUDA context
    and its allocator's memory on the GPU that the trials then train on, and kept the device it
    started with for a later measurement given another GPU (CUDA reads CUDA_VISIBLE_DEVICES once)."""
    import ray  # noqa: PLC0415 - as in join: seconds, for the commands that use Ray only

    return ray.remote(**resources)(function)
