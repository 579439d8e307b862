"""Every relative link of the README and docs/ points at a file of the repository (a user's
clone has nothing outside it)."""
import re

from helpers import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_resolve_inside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "experiments/README.md"]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists() or ROOT.resolve() not in path.parents:
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links that do not resolve inside the repository:\n" + "\n".join(broken)
