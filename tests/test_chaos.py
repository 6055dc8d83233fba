"""The chaos soak's short version (benchmarks/chaos.py --short): a search on a local multi-node
cluster with PostgreSQL tracking through a driver SIGKILL, a Ctrl-C, a worker node's death,
terminated database connections, a resume that starts while the database refuses connections and
(as root) the trial storage's disk filled, each followed by what a user would do, and each fired
once a trial is in flight; its audit of MLflow, Optuna, the checkpoints, the console, each fault's
effect and what each fault met must count zero everywhere.
The full soak (60 trials, an outage longer than the retries) is run by hand: see
docs/performance.md#faults-the-chaos-soak."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.long  # 200 s; node death, Ctrl-C and an outage mid-launch are long alone too: `pytest -m long`
def test_short_chaos_soak_audits_clean():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "chaos.py"
    out = subprocess.run(
        [sys.executable, str(script), "--short", "--seed", "11"], capture_output=True, text=True, timeout=1200
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "console lines not ours           0" in out.stdout and "faults not fired" in out.stdout
    assert "kinds that met no running trial  0" in out.stdout, out.stdout[-4000:]
    assert re.search(r"^  faults not fired +\d+$", out.stdout, re.M), out.stdout[
        -2000:
    ]  # counted, not just named
