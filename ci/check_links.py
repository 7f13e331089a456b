#!/usr/bin/env python3
"""Fails on a broken relative link in the guide's Markdown (docs/guide/src): a file that does not
exist, or an #anchor that no heading of the target makes (mdBook's own ids: lower case, spaces to
hyphens, other punctuation dropped). Links with a scheme (https:, mailto:) are not followed: the
guide builds with no network."""

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "docs" / "guide" / "src"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    found = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


def main() -> int:
    broken = []
    for page in sorted(SRC.rglob("*.md")):
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.relative_to(SRC)}: {target}: no such file")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path):
                broken.append(f"{page.relative_to(SRC)}: {target}: no heading makes #{fragment}")
    for line in broken:
        print(line, file=sys.stderr)
    print(f"links: {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
