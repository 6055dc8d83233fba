"""A real multi-node Ray cluster on this machine, shared by tests/test_cluster.py and the chaos soak
(benchmarks/chaos.py). Nodes are started with `ray start`, each in a process group of its own,
stopped by killing that group: never with `ray stop`, which would stop every Ray on the machine."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


# Ports a Ray node takes whatever `--port` says (its dashboard agent, dashboard, client server and
# workers): a head given one of them as its port does not start. The system's free ports include 52365.
RAY_FIXED_PORTS = frozenset({6379, 8265, 10001, 52365, *range(10002, 20000)})


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_FIXED_PORTS:
            return port


class Cluster:
    """A head node (no CPUs: it only coordinates) and `workers` worker nodes with one CPU each."""

    def __init__(self, workers: int = 0, env: dict[str, str] | None = None):
        self.port = free_port()
        self.tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
        # Ray 2.60 enables token authentication on a local head: every node and the driver share one token.
        self.env = {
            **os.environ,
            **(env or {}),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": uuid.uuid4().hex * 2,
            "RAY_TMPDIR": self.tmp,
            "RAY_DEDUP_LOGS": "0",
            "PYTHONUNBUFFERED": "1",
        }
        self.groups: list[int] = []
        self.start("--head", f"--port={self.port}", "--include-dashboard=false", "--num-cpus=0")
        self.workers = [self.worker() for _ in range(workers)]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *args, hide: Path | None = None, hostname: str | None = None) -> int:
        """Start a node; with `hide`, in a private mount namespace with an empty tmpfs over that
        folder, as a second machine would be; with `hostname`, under a name of its own. Returns its
        process group."""
        command = [RAY, "start", *args]
        if hide is not None:
            command = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount -t tmpfs tmpfs "{hide}" && exec "$@"',
                "sh",
                *command,
            ]
        if hostname is not None:
            command = ["unshare", "--uts", "sh", "-c", f'hostname "{hostname}" && exec "$@"', "sh", *command]
        node = subprocess.Popen(
            command,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        self.groups.append(node.pid)
        out, _ = node.communicate(timeout=120)
        if node.returncode:
            raise RuntimeError(out)
        return node.pid

    def worker(self, hide: Path | None = None) -> int:
        return self.start(f"--address={self.address}", "--num-cpus=1", hide=hide)

    @staticmethod
    def kill(group: int) -> None:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        for group in self.groups:
            self.kill(group)
        shutil.rmtree(self.tmp, ignore_errors=True)


def leave_free(folder: Path, free: int) -> Path:
    """Fills the disk of `folder` until `free` bytes are left: a neighbour's job filling the disk
    (the chaos soak's disk_full fault and tests/test_edges.py). Other writers may share the disk (a
    driver writing checkpoints): the free space is measured again before each chunk, and a write
    that finds the disk full (another writer took the last of it) ends the filling."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: no write left for close to fail on
        while (left := available(folder) - free) > 0:
            try:
                f.write(b"\0" * min(left, 1 << 20))
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
    return filler


def available(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize
