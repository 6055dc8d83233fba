"""Shared fixtures: the headless browser that checks the pages a researcher reads; the data sets
users bring; a throwaway PostgreSQL database."""

import os
import shutil
from types import SimpleNamespace

import pytest

BROWSER_HINT = (
    "no Chromium found: install it (Debian/Ubuntu: apt-get install chromium, as .ci/run does) or point "
    "CHROMIUM at a Chrome or Chromium binary"
)


@pytest.fixture()
def chromium() -> str:
    """The Chromium binary; without one the test is skipped with how to get one, or fails where
    SYSGEN_REQUIRE_BROWSER is set (CI installs one and must not skip the check)."""
    found = (
        os.environ.get("CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if not found:
        (pytest.fail if os.environ.get("SYSGEN_REQUIRE_BROWSER") else pytest.skip)(BROWSER_HINT)
    return found


@pytest.fixture()
def fresh_compiles():
    """No compiled code in this process: -> the number of functions compiled since."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    start = counters["frames"]["ok"]
    return lambda: counters["frames"]["ok"] - start


@pytest.fixture()
def downloaded_data(tmp_path, monkeypatch):
    """bAbI's and Multi30K's files cannot be downloaded here: folders with a line or two of each,
    named by BABI_DATA and MULTI30K_DATA, where the shipped files and presets expect them."""
    babi, multi30k = tmp_path / "babi", tmp_path / "multi30k"
    babi.mkdir()
    multi30k.mkdir()
    for number in range(1, 21):
        (babi / f"qa{number}_task_train.txt").write_text(
            "1 Mary went to the kitchen.\n2 Where is Mary?\tkitchen\t1\n"
        )
    for part in ("train", "val", "test_2016_flickr"):
        (multi30k / f"{part}.en").write_text("A dog runs.\nA dog and a man run.\n")
        (multi30k / f"{part}.de").write_text("Ein Hund rennt.\nEin Hund und ein Mann rennen.\n")
    monkeypatch.setenv("BABI_DATA", str(babi))
    monkeypatch.setenv("MULTI30K_DATA", str(multi30k))
    return tmp_path


@pytest.fixture()
def postgres_database():
    """A throwaway database on the local PostgreSQL (trust auth), dropped after the test with every
    connection to it: its `name`, its SQLAlchemy `uri`, and `admin`, an autocommit connection to the
    server's `test` database for the test's own faults (terminating connections, refusing them)."""
    import uuid

    import psycopg

    name = f"sysgen_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True)
    admin.execute(f"CREATE DATABASE {name}")
    try:
        yield SimpleNamespace(
            name=name, uri=f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", admin=admin
        )
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
