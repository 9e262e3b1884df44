#!/usr/bin/env python3
"""Check the relative links of the project's Markdown files.

Every relative link in README.md, BENCHMARKS.md, CHANGELOG.md,
CONTRIBUTING.md and docs/**/*.md must resolve to a file or folder in the
repository, and a link's #anchor, if any, to a heading of the Markdown file
it points to (GitHub's heading ids). Links to other schemes (https:, mailto:)
are not fetched. Links inside fenced code blocks and inline code are ignored.

Usage: python3 scripts/check-links.py [FILE.md ...]
Exits non-zero and lists every broken link as `file:line: link (why)`.
Standard library only.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["README.md", "BENCHMARKS.md", "CHANGELOG.md", "CONTRIBUTING.md"]

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def markdown_files(args):
    if args:
        return [Path(a).resolve() for a in args]
    files = [ROOT / f for f in DEFAULT if (ROOT / f).exists()]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return files


def prose_lines(text, keep_code_spans=False):
    """(line number, line) outside fenced code blocks, inline code blanked
    unless `keep_code_spans`."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line if keep_code_spans else CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line)


def slug(heading):
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", heading)                       # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)        # links keep their text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        ids, seen = set(), {}
        for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_code_spans=True):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                ids.add(base if k == 0 else f"{base}-{k}")
            ids.update(HTML_ID.findall(line))
        _anchors[path] = ids
    return _anchors[path]


def check(path):
    broken = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        targets = [m.group(1) for m in INLINE.finditer(line)]
        m = REFDEF.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue                                   # https:, mailto:, …
            link, _, anchor = target.partition("#")
            dest = path if link == "" else (path.parent / link).resolve()
            where = f"{path.relative_to(ROOT)}:{n}: {target}"
            try:
                dest.relative_to(ROOT)
            except ValueError:
                broken.append(f"{where} (outside the repository)")
                continue
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and dest.is_file() and anchor not in anchors(dest):
                broken.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return broken


def main():
    files = markdown_files(sys.argv[1:])
    broken = [b for f in files for b in check(f)]
    for b in broken:
        print(b, file=sys.stderr)
    if broken:
        print(f"check-links: {len(broken)} broken link(s) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"check-links: {len(files)} files, every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
