"""Every relative link of the README and docs/ points at a file of the repository (a user's
clone has nothing outside it), and every ``#anchor`` at a heading of its page."""
import re
from pathlib import Path

from helpers import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces → hyphens."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in HEADING.findall(text)}


def test_slugs_follow_github():
    assert anchors(ROOT / "README.md") >= {"quick-start-two-commands", "documentation"}


def test_relative_links_and_anchors_resolve_inside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "experiments/README.md"]
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists() or (path_part and ROOT.resolve() not in path.parents):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that do not resolve inside the repository:\n" + "\n".join(broken)
