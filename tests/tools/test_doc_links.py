"""Every relative link in the repository's Markdown files resolves: the file exists, and a
#fragment into a Markdown file names one of its headings (GitHub's anchors). BENCHMARKS.md's
standing rows link into sections of docs/benchmarks-history.md, so renaming a heading there
must fail here. Run by ctest (every test in tests/tools)."""
import os
import re
import unittest
import urllib.parse

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP_DIRS = {"node_modules", "dist"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def lines_outside_fences(path):
    fence = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fence = not fence
            elif not fence:
                yield number, line


def anchors(path):
    """GitHub's heading ids: lower case, punctuation dropped, spaces to '-', repeats -1, -2."""
    seen, out = {}, set()
    for _, line in lines_outside_fences(path):
        m = HEADING.match(line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(f"{slug}-{n}" if n else slug)
    return out


def markdown_files():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x not in SKIP_DIRS]
        yield from (os.path.join(d, f) for f in files if f.endswith(".md"))


class DocLinksTest(unittest.TestCase):
    def test_relative_links_resolve(self):
        bad, checked, cache = [], 0, {}
        for md in sorted(markdown_files()):
            for number, line in lines_outside_fences(md):
                for m in LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                        continue  # http:, mailto:, ...
                    checked += 1
                    path, _, fragment = target.partition("#")
                    full = os.path.normpath(os.path.join(os.path.dirname(md), urllib.parse.unquote(path))) if path else md
                    where = f"{os.path.relpath(md, ROOT)}:{number}: {target}"
                    if not os.path.exists(full):
                        bad.append(f"{where} (no such file)")
                    elif fragment and full.endswith(".md"):
                        if full not in cache:
                            cache[full] = anchors(full)
                        if urllib.parse.unquote(fragment) not in cache[full]:
                            bad.append(f"{where} (no such heading)")
        self.assertGreater(checked, 0)
        self.assertEqual(bad, [], "\n".join(bad))

    def test_anchor_rule(self):
        # The ids GitHub gives headings of the kinds the history uses.
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False, encoding="utf-8") as f:
            f.write("# Benchmarks\n## Prefill at the machine's limit (issue 57, 2026-12-02)\n"
                    "```sh\n# not a heading\n```\n## `serve --match-chunks`: stuffed\n## What loses at ρ 0.15\n## Benchmarks\n")
        try:
            self.assertEqual(anchors(f.name), {
                "benchmarks", "prefill-at-the-machines-limit-issue-57-2026-12-02",
                "serve---match-chunks-stuffed", "what-loses-at-ρ-015", "benchmarks-1"})
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
