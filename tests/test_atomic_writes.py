"""Every file a reader may open is written whole or not at all (orchestrator/record/files.py): each
writer, run for real in a child process on a small launch, is killed (SIGKILL) as it renames its
written temporary onto the file, and the file holds its old content; a run left alone writes the new.
A writer that writes in place fails here: it is never killed there, its file already rewritten."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_board import PAPER_CTL, ctl_ablation, plant
from test_export import bare_launch, search_launch
from test_report import ablation_text, fake_launch, scores_for
from test_status import SEARCH, launch

from orchestrator.record.files import atomic_path, write_atomically
from orchestrator.report import board

OLD = b"the old file, whole\n"


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def with_old(target: Path, old: bytes = OLD) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(old)
    return target


# Per writer: setup(tmp_path) -> the file it writes, holding its old content; and the code that runs
# the real writer on it (with `tmp_path` and `target`), in a child that imports no more than it needs.
def report_setup(tmp_path: Path, name: str = "report.html") -> Path:
    text = ablation_text("ndr_layers_test")
    state = fake_launch(tmp_path, sqlite(tmp_path), "night-1", scores_for(0), text)
    return with_old(state.dir / "report" / name)


def board_setup(tmp_path: Path) -> Path:
    plant(tmp_path, sqlite(tmp_path), "ctl-tiny", ctl_ablation(n_iters=20), PAPER_CTL)
    return with_old(tmp_path / "runs" / "board" / "board.html")


def board_docs_setup(tmp_path: Path) -> Path:
    board_setup(tmp_path)
    page = f"# Results\n\n{board.DOCS_BEGIN}\nold\n{board.DOCS_END}\n"
    return with_old(tmp_path / "docs" / "results.md", page.encode())


def best_setup(tmp_path: Path) -> Path:
    runs = {((), k): ("completed", 0.5 + 0.1 * k, 0.4 + 0.1 * k) for k in range(3)}
    state = launch(tmp_path, {**SEARCH, "scheduler": {"name": "fifo"}}, runs)
    return with_old(state.dir / "best" / "fwd__ndr.yaml")


def export_setup(tmp_path: Path, fmt: str) -> Path:
    state, _ = search_launch(tmp_path, sqlite(tmp_path))
    return with_old(state.dir / "export" / f"runs.{fmt}")


def launch_json_setup(tmp_path: Path) -> Path:
    return bare_launch(tmp_path, sqlite(tmp_path)).dir / "launch.json"


MAIN = "from orchestrator.cli.process import main\n"
REPORT = (
    "from orchestrator.record.state import LaunchState\nfrom orchestrator.report import report\n"
    "report.write_report(LaunchState.load(tmp_path / 'night-1'))"
)
BOARD = MAIN + "assert main(['board', '--storage-path', str(tmp_path / 'runs')]) == 0"
DOCS = MAIN + "assert main(['board', '--storage-path', str(tmp_path / 'runs'), '--docs', str(target)]) == 0"
EXPORT = MAIN + "assert main(['export', '--storage-path', str(tmp_path), '--format', target.suffix[1:]]) == 0"
WRITERS = {
    "report": (report_setup, REPORT),
    "report figure": (lambda tmp_path: report_setup(tmp_path, "ctl_backward__ndr.png"), REPORT),
    "board": (board_setup, BOARD),
    "board docs page": (board_docs_setup, DOCS),
    "best": (best_setup, MAIN + "assert main(['best', str(target.parent.parent)]) == 0"),
    "export csv": (lambda tmp_path: export_setup(tmp_path, "csv"), EXPORT),
    "export parquet": (lambda tmp_path: export_setup(tmp_path, "parquet"), EXPORT),
    "launch.json": (
        launch_json_setup,
        "from orchestrator.record.state import LaunchState\n"
        "state = LaunchState.load(target.parent)\nstate.state = 'interrupted'\nstate.save()",
    ),
}

# The child: os.replace kills it where it would put the written temporary in the file's place.
CHILD = """
import os, signal, sys
from pathlib import Path
tmp_path, target = Path(sys.argv[1]), Path(sys.argv[2])
replace = os.replace

def killed_replace(source, destination, **kwargs):
    if Path(destination) == target:
        assert Path(source).stat().st_size > 0  # the new file, whole and on the disk
        os.kill(os.getpid(), signal.SIGKILL)
    replace(source, destination, **kwargs)

os.replace = killed_replace
"""


@pytest.mark.parametrize("name", WRITERS)
def test_a_writer_killed_mid_write_leaves_the_old_file_whole(tmp_path, name):
    setup, write = WRITERS[name]
    target = setup(tmp_path)
    old = target.read_bytes()
    child = subprocess.run(
        [sys.executable, "-c", CHILD + write, str(tmp_path), str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr[-3000:])
    assert target.read_bytes() == old
    exec(write, {"tmp_path": tmp_path, "target": target})  # left alone: the new file
    new = target.read_bytes()
    assert new and new != old
    assert target.name not in {p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")}


def test_a_write_that_fails_leaves_the_file_as_it_was_and_no_temporary(tmp_path):
    target = with_old(tmp_path / "page.html")
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_text("half a pa")
        raise RuntimeError("the writer failed")
    with pytest.raises(TypeError):
        write_atomically(target, 12)  # neither text nor bytes: fails as it writes
    assert target.read_bytes() == OLD and os.listdir(tmp_path) == ["page.html"]
    write_atomically(target, "the new file\n")
    assert target.read_text() == "the new file\n" and os.listdir(tmp_path) == ["page.html"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
