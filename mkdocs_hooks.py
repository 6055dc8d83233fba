"""The docs site's hook: a page's `<!-- reference: NAME -->` becomes the reference NAME
(orchestrator.reference), generated from the service's own definitions at each build."""

import re

from orchestrator.reference import PAGES

MARKER = re.compile(r"<!-- reference: ([\w-]+) -->")


def on_page_markdown(markdown: str, **_) -> str:
    return MARKER.sub(lambda m: PAGES[m.group(1)](), markdown)
