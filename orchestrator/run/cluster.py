"""Joining the Ray cluster a launch names, shared by the launch and the dry run's cost."""
from __future__ import annotations

from ..plan.storage import last_line


class ClusterUnreachable(RuntimeError):
    """Ray could not join the cluster at --address; refused before anything is written."""


def join(address: str, **options) -> None:
    """ray.init at `address`. A port that answers but is no Ray head's (a dashboard's, another
    service's), or a head this machine has no raylet of, makes Ray retry for about half a minute
    and then raise ConnectionError: one line then, not its traceback."""
    import ray

    try:
        ray.init(address=address, **options)
    except ConnectionError as e:
        raise ClusterUnreachable(f"Ray could not join a cluster at {address}: {last_line(e)}") from None
