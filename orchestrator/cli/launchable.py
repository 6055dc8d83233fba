"""What a launch needs beyond a valid file, checked before anything starts: folders it can
write, a free --launch-id, and a Ray cluster that answers with this machine among its nodes."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from ray._private.services import find_node_ids

from ..record.stores import unwritable
from .inputs import UsageError


def check_launchable(args, file: str, study, nightly: bool) -> None:
    """What a launch of `study` (from `file`) needs beyond a valid file: an ablation for `nightly`,
    folders it can write, and a --launch-id no launch has taken."""
    if nightly and not study.is_ablation:
        raise UsageError(
            f"{file}: grid: the nightly job runs ablations (a grid or seeds); this file is a search"
        )
    check_writable(Path(study.storage_path), f"{file}: storage_path")
    if not study.storage.is_object_store:
        # A dry run checks it here; a launch also on every node (run.preflight.check_storage).
        problem = unwritable(Path(study.storage.uri).expanduser())
        if problem:
            raise UsageError(
                f"{'--storage' if args.storage else f'{file}: storage'}: cannot write trial storage in "
                f"{study.storage.uri} ({problem})"
            )
    if args.launch_id and (Path(study.storage_path) / args.launch_id / "launch.json").exists():
        raise UsageError(
            f"--launch-id: launch {args.launch_id} exists in {study.storage_path}; "
            f"`orchestrator resume {args.launch_id}` goes on with it, another id starts a new one"
        )


def check_writable(folder: Path, where: str) -> None:
    problem = unwritable(folder)
    if problem:
        raise UsageError(f"{where}: cannot create launch folders in {folder} ({problem})")


# What an HTTP/2 client sends first: the preface and an empty SETTINGS frame (RFC 9113, 3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def read_at_most(conn: socket.socket, size: int) -> bytes:
    """Up to `size` bytes, fewer where the peer closes the connection first."""
    got = b""
    while len(got) < size:
        chunk = conn.recv(size - len(got))
        if not chunk:
            break
        got += chunk
    return got


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """A HOST:PORT cluster must answer as Ray's GCS does, within seconds (Ray itself retries for
    minutes, deaf to SIGTERM), and this machine must be one of its nodes: Ray connects a driver
    through a raylet of its own machine, and without one gives up after a minute with a
    ConnectionError (a Kubernetes pod, a laptop). The GCS is a gRPC server: it answers HTTP/2's
    preface with a SETTINGS frame at once (RFC 9113, 3.4); a silent port kept ray.init waiting past
    300 s, and Redis on Ray's old default port 6379 answers "-ERR unknown command"."""
    if not address or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        conn = socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s)
    except (OSError, ValueError) as e:
        raise UsageError(
            f"--address: no Ray cluster answers at {address} within {timeout_s:.0f} s ({e})"
        ) from None
    with conn:
        try:
            conn.sendall(HTTP2_PREFACE)
            header = read_at_most(conn, 9)  # a frame's header: length (3), type (1), flags, stream
        except TimeoutError:
            raise UsageError(
                f"--address: {address} accepted a connection but sent nothing back within {timeout_s:.0f} s: "
                "no Ray cluster answers there"
            ) from None
        except OSError as e:
            raise UsageError(
                f"--address: {address} is not a Ray cluster's head: it reset the connection "
                f"({e.strerror or e})"
            ) from None
        if len(header) == 9 and header[3] == 4:  # 4: SETTINGS
            return check_ray_node(address)
        with contextlib.suppress(OSError):  # the rest of its first line, to name what answers
            conn.settimeout(0.5)
            header += conn.recv(64)
    found = header.splitlines()[0][:60] if header.strip() else b""
    raise UsageError(
        f"--address: {address} is not a Ray cluster's head: "
        + (f"it answered {found!r}" if found else "it closed the connection, saying nothing")
    )


def check_ray_node(address: str) -> None:
    """This machine runs a raylet of the cluster at `address` (a driver connects through one)."""
    if not find_node_ids():  # the raylets running here, as ray.init looks for them
        raise UsageError(
            f"--address: this machine is not a node of the Ray cluster at {address}, and a driver runs on "
            f"one: join it first with `ray start --address {address} --num-cpus=0` (trials never run there; "
            "deploy/README.md)"
        )
