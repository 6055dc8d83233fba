"""The docs site's hook: the site reads the committed pages, whose generated parts `make reference`
writes (orchestrator.reference); a build where one is stale fails, naming the command."""

from pathlib import Path

from mkdocs.exceptions import PluginError

from orchestrator.reference import COMMAND, stale


def on_pre_build(config, **_) -> None:
    pages = stale(Path(config["docs_dir"]).resolve().parent)
    if pages:
        raise PluginError(f"stale generated text in {', '.join(map(str, pages))}: run `{COMMAND}`")
