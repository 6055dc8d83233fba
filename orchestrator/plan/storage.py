"""Where Tune keeps experiment state and trial checkpoints: storage that every node of the cluster sees.

Since Ray 2.7 every node writes its trials' checkpoints straight to the storage path, so on a cluster
of more than one machine it must be a shared filesystem (NFS, ...) or an object store. Credentials
for an object store come from the environment of each node (AWS_ACCESS_KEY_ID, ... for s3://) and
are never part of the URI, the search-space file or anything we write.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

OBJECT_STORE_SCHEMES = ("s3", "gs")


class StorageError(RuntimeError):
    pass


@dataclass(frozen=True)
class TrialStorage:
    """`uri` is a local or shared folder, or s3://bucket/prefix (`endpoint` for S3-compatible stores)."""

    uri: str
    endpoint: str | None = None

    @property
    def is_object_store(self) -> bool:
        return urlsplit(self.uri).scheme in OBJECT_STORE_SCHEMES

    def validate(self) -> None:
        """Raises ValueError with the reason; called while the search-space file is read."""
        parts = urlsplit(self.uri)
        if parts.scheme and parts.scheme not in OBJECT_STORE_SCHEMES:
            raise ValueError(
                f"unsupported scheme {parts.scheme!r}: use a folder (local or shared, e.g. NFS) or "
                "s3://bucket/prefix"
            )
        if self.is_object_store:
            if not parts.netloc:
                raise ValueError(f"{self.uri!r} names no bucket")
            if "@" in parts.netloc or parts.query:
                raise ValueError(
                    "credentials and options do not belong in the URI: set AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY on every node and the endpoint under storage.endpoint"
                )
        elif self.endpoint:
            raise ValueError("endpoint applies only to an object store (s3://...)")
        if self.endpoint and urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise ValueError(f"endpoint must be http(s)://host:port, got {self.endpoint!r}")
        if self.endpoint and ("@" in urlsplit(self.endpoint).netloc or urlsplit(self.endpoint).query):
            raise ValueError(
                "endpoint: credentials and options do not belong in it (it is stored with the launch): set "
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY on every node"
            )

    def resolved(self) -> TrialStorage:
        """A local folder made absolute, so a resume from another folder finds the same place."""
        return self if self.is_object_store else TrialStorage(str(Path(self.uri).expanduser().resolve()))

    def filesystem(self):
        """(pyarrow filesystem, path inside it). Without an object store: the local filesystem, and
        Tune's own handling of a plain path."""
        if not self.is_object_store:
            return None, str(Path(self.uri).expanduser().resolve())
        # pyarrow (Ray's and MLflow's, not ours) costs 0.2 s to import; a local folder goes without.
        import pyarrow.fs  # noqa: PLC0415

        parts = urlsplit(self.uri)
        if parts.scheme == "s3":
            kwargs = {}
            if self.endpoint:
                endpoint = urlsplit(self.endpoint)
                kwargs = {"endpoint_override": endpoint.netloc, "scheme": endpoint.scheme}
            # No keys given: each node resolves its own from its environment, so pickles carry none.
            fs = pyarrow.fs.S3FileSystem(**kwargs)
        else:
            fs = pyarrow.fs.GcsFileSystem()
        return fs, (parts.netloc + parts.path).rstrip("/")

    def join(self, *names: str) -> str:
        return "/".join([self.uri.rstrip("/"), *names])


def last_line(error: BaseException) -> str:
    """An error's last line (a remote task's cause ends with its own), or its type where it says nothing."""
    return (str(error).strip().splitlines() or [type(error).__name__])[-1]


def _read_marker(fs, path: str) -> tuple[str | None, str]:
    """-> (the marker's contents, "") or (None, why it cannot be read). Returned, not raised: a check
    cut short (Ctrl-C) leaves tasks behind, and Ray prints every error nobody collected."""
    # pyarrow (Ray's and MLflow's, not ours) costs 0.2 s; `status` reads this module without it.
    import pyarrow.fs  # noqa: PLC0415

    fs = fs or pyarrow.fs.LocalFileSystem()
    try:
        with fs.open_input_stream(path) as f:
            return f.read().decode(), ""
    except Exception as e:  # whatever the filesystem raises
        return None, last_line(e)


def _write_marker(storage: TrialStorage, key: str) -> tuple:
    """A marker with a fresh token, written to the storage from the driver: -> (the storage's
    filesystem for the tasks, the driver's, the marker's path, its token)."""
    import pyarrow.fs  # noqa: PLC0415 - as _read_marker's

    fs, root = storage.filesystem()
    local = fs or pyarrow.fs.LocalFileSystem()
    token = uuid.uuid4().hex
    marker = f"{root}/.sysgen-storage-check-{token}"
    try:
        local.create_dir(root, recursive=True)
        with local.open_output_stream(marker) as f:
            f.write(token.encode())
    except (OSError, pyarrow.ArrowException) as e:
        with contextlib.suppress(OSError, pyarrow.ArrowException):  # a full disk leaves it empty, not gone
            local.delete_file(marker)
        # the cause kept: a disk that is full is a fault the caller may resume from, not bad input
        problem = f"{key}: the driver cannot write to {storage.uri}: {str(e).splitlines()[0]}"
        raise StorageError(problem) from e
    return fs, local, marker, token


def _nodes_that_see(storage: TrialStorage, key: str, fs, marker: str, token: str) -> int:
    """Reads the marker back from a task pinned to every alive node: -> the number of nodes that
    saw it; StorageError naming the first that cannot (one that died meanwhile is left out)."""
    # Ray takes seconds to import; this module is read by commands that never start it.
    import ray  # noqa: PLC0415
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) < 2:
        return len(nodes)
    read = ray.remote(num_cpus=0, max_retries=0)(_read_marker)
    pending = {
        read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            fs, marker
        ): node
        for node in nodes
    }
    checked = len(nodes)
    for ref, node in pending.items():
        try:
            seen, reason = ray.get(ref, timeout=60)
        except Exception as e:  # the task or its node died
            seen, reason = None, last_line(getattr(e, "cause", e))
        reason = reason or "it reads other contents"
        if seen != token:
            if not any(n["NodeID"] == node["NodeID"] and n["Alive"] for n in ray.nodes()):
                # It died since the list was taken (Ray had not yet marked a killed node dead):
                # not a node of the cluster, and no reason to refuse the launch.
                checked -= 1
                continue
            fix = (
                "put it on a filesystem every node mounts at the same path (NFS, ...) or use "
                "s3://bucket/prefix"
                if not storage.is_object_store
                else "give every node the same credentials and endpoint"
            )
            raise StorageError(
                f"{key}: node {node['NodeManagerAddress']} ({node['NodeID'][:8]}) cannot see {storage.uri} "
                f"({reason}); {fix} (see deploy/README.md)"
            )
    return checked


def check_cluster_sees(storage: TrialStorage, key: str) -> int:
    """Write a marker to the storage from the driver and read it back from a task pinned to every
    alive node. Returns the number of nodes; raises StorageError naming the first node that cannot
    see it (a node that dies during the check is left out). Assumes Ray is initialised."""
    import pyarrow  # noqa: PLC0415 - as _read_marker's

    fs, local, marker, token = _write_marker(storage, key)
    try:
        return _nodes_that_see(storage, key, fs, marker, token)
    finally:
        try:
            local.delete_file(marker)
        except (OSError, pyarrow.ArrowException):
            pass
