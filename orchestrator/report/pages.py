"""The Jinja2 environment the report's and the board's pages render with (templates/)."""

from __future__ import annotations

import datetime
from pathlib import Path

import jinja2

from . import stats

TEMPLATES = Path(__file__).with_name("templates")


def environment() -> jinja2.Environment:
    """The templates' environment: numbers as stats.fmt writes them (`f3`), a Unix time in UTC (`utc`)."""
    # The page escapes what it shows (select_autoescape(["html"]) would not: the template's name ends
    # in .j2); the macros of cells.j2, shared with the Markdown, are escaped where the page shows them.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=lambda name: (name or "").endswith(".html.j2"),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["f3"] = stats.fmt
    env.filters["utc"] = lambda t: datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M")
    return env
