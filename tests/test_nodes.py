"""The test cluster's helpers (tests/nodes.py)."""

import os
import subprocess
import sys
from pathlib import Path

import nodes
import pytest


def test_a_free_port_is_never_one_a_ray_node_takes_for_itself(monkeypatch):
    """A CI run failed when the system's free port for a head was 52365, the port Ray's dashboard
    agent takes on every node: the head never started."""
    offered = iter([52365, 8265, 10001, 15000, 41234])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(nodes.socket, "socket", Socket)
    assert nodes.free_port() == 41234


# Run in a mount namespace of its own: the tmpfs goes with the process, even if the test is killed.
FILL = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import nodes
disk, measure = Path(sys.argv[2]), os.statvfs
filler = nodes.leave_free(disk, 256 << 10)
print(nodes.available(disk) - (256 << 10))
filler.unlink()


def measured_then_another_writes(path):
    stats = measure(path)
    try:  # a driver writing a checkpoint between the measure and the filler's write
        with open(disk / "checkpoint", "ab") as f:
            f.write(b"x" * (64 << 10))
    except OSError:
        pass  # the disk was full for it too
    return stats


os.statvfs = measured_then_another_writes
nodes.leave_free(disk, 0)
print(nodes.available(disk))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_leave_free_leaves_what_it_is_asked_and_stops_where_another_writer_filled_the_disk(tmp_path):
    """The chaos soak crashed with ENOSPC in leave_free (seed 613): it measured the free space once,
    then wrote that much while a resumed driver wrote checkpoints to the same disk. Alone it leaves
    what it is asked to; where another writer takes space after each measure, it fills the disk to
    0 and returns."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = f'mount -t tmpfs -o size=4M tmpfs "{disk}" && exec "$@"'
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
        + [sys.executable, "-c", FILL, str(Path(nodes.__file__).parent), str(disk)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["0", "0"]
