"""Shared fixtures: the headless browser that checks the pages a researcher reads."""
import os
import shutil

import pytest

BROWSER_HINT = ("no Chromium found: install it (Debian/Ubuntu: apt-get install chromium, as .ci/run does) or point "
                "CHROMIUM at a Chrome or Chromium binary")


@pytest.fixture()
def chromium() -> str:
    """The Chromium binary; without one the test is skipped with how to get one, or fails where
    SYSGEN_REQUIRE_BROWSER is set (CI installs one and must not skip the check)."""
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        (pytest.fail if os.environ.get("SYSGEN_REQUIRE_BROWSER") else pytest.skip)(BROWSER_HINT)
    return found
