#!/usr/bin/env python3
"""Extracts and cleans the default corpus's English text from installed Debian packages into
JSON lines (one {"text": ...} per document), one file per source, for `stableflash prepare`.

  python3 scripts/corpus_clean.py OUTDIR STATS.json   # OUTDIR/<source>.jsonl; counts to STATS.json

What each source contributes and how it is cleaned is documented in docs/default-corpus.md.
Standard library only; deterministic (files in sorted order, no randomness).
"""
import glob, gzip, hashlib, html.parser, json, os, re, sys

LINUX_DOC = "/usr/share/doc/linux-doc-6.1/Documentation"
PYTHON_DOC = "/usr/share/doc/python3.11/html/_sources"
HANDBOOK = "/usr/share/doc/debian-handbook/html/en-US"
GCIDE = "/usr/share/dictd/gcide"
PERL_POD = "/usr/share/perl/5.36.0/pod"
GIT_DOC = "/usr/share/doc/git-doc"
GNU_STANDARDS = "/usr/share/doc/gnu-standards"


def read(path):
    """Bytes of a file, gunzipped when it ends in .gz; None when it is not UTF-8."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tidy(text):
    """Common to all sources: Unix newlines, no trailing spaces, at most one blank line in a row,
    no tabs turned into anything (code keeps its indentation), no leading/trailing blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    lines = [l.rstrip() for l in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def linux_doc():
    """The kernel's reStructuredText sources, English only (translations/ skipped); the SPDX
    licence tag that opens most files is dropped (it is metadata, not prose)."""
    for path in sorted(glob.glob(f"{LINUX_DOC}/**/*.rst.gz", recursive=True)):
        if "/translations/" in path:
            continue
        text = read(path)
        if text is None:
            yield path, None
            continue
        text = re.sub(r"^\.\. SPDX-License-Identifier:.*\n", "", text, flags=re.M)
        yield path, text


def python_doc():
    """The Python 3.11 manual as Sphinx keeps its sources (_sources/*.rst.txt)."""
    for path in sorted(glob.glob(f"{PYTHON_DOC}/**/*.rst.txt", recursive=True)):
        yield path, read(path)


class HtmlText(html.parser.HTMLParser):
    """Visible text of a DocBook HTML page: navigation, scripts and styles dropped, block elements
    as paragraph breaks, <pre> kept verbatim, other whitespace collapsed."""
    BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr", "table", "pre", "br",
              "blockquote", "ul", "ol", "dl", "section", "title"}
    SKIP = {"script", "style", "head"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.skip, self.pre, self.nav = [], 0, 0, 0
        self.stack = []

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        ident = dict(attrs).get("id") or ""
        # The handbook's page furniture: the banner, the title bar, prev/next links, the ToC.
        is_nav = (tag == "div" and (ident == "banner" or "toc" in cls.split())) or \
                 (tag == "ul" and "docnav" in cls.split()) or (tag == "p" and ident == "title")
        self.stack.append((tag, is_nav))
        if is_nav:
            self.nav += 1
        if tag in self.SKIP:
            self.skip += 1
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCKS:
            self.out.append("\n\n")

    def handle_endtag(self, tag):
        while self.stack:
            t, is_nav = self.stack.pop()
            if is_nav:
                self.nav -= 1
            if t in self.SKIP:
                self.skip -= 1
            if t == "pre":
                self.pre -= 1
            if t == tag:
                break
        if tag in self.BLOCKS:
            self.out.append("\n\n")

    def handle_data(self, data):
        if self.skip or self.nav:
            return
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self):
        paragraphs = [p.strip(" ") for p in "".join(self.out).split("\n\n")]
        return "\n\n".join(p for p in paragraphs if p.strip())


def debian_handbook():
    """The Debian Administrator's Handbook, English HTML, as plain text."""
    for path in sorted(glob.glob(f"{HANDBOOK}/*.html")):
        text = read(path)
        if text is None:
            yield path, None
            continue
        parser = HtmlText()
        parser.feed(text)
        yield path, parser.text()


def b64_number(s):
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = 0
    for c in s:
        n = n * 64 + digits.index(c)
    return n


def gcide():
    """GCIDE (Webster's 1913 + WordNet), one document per dictionary entry, located through the
    dictd index. Markup stripped: the \\pro*nun"ci*a`tion\\ field, source tags such as
    [1913 Webster] and [PJC], {braces} around cross-references; hard-wrapped lines are joined into
    paragraphs."""
    with gzip.open(f"{GCIDE}.dict.dz", "rb") as f:  # dictzip is gzip-compatible
        data = f.read()
    seen = set()
    with open(f"{GCIDE}.index", encoding="utf-8") as idx:
        entries = []
        for line in idx:
            word, off, size = line.rstrip("\n").split("\t")
            if word.startswith("00-database") or off in seen:
                continue
            seen.add(off)
            entries.append((b64_number(off), b64_number(size)))
    for off, size in sorted(entries):
        try:
            text = data[off:off + size].decode("utf-8")
        except UnicodeDecodeError:
            yield f"gcide@{off}", None
            continue
        text = re.sub(r"\\[^\\\n]*\\", "", text)                              # pronunciation
        text = re.sub(r"^\s*\[[^\]\n]*\]\s*$", "", text, flags=re.M)           # [1913 Webster]
        text = re.sub(r"[{}]", "", text)                                        # {cross refs}
        paragraphs = re.split(r"\n\s*\n", text)
        text = "\n\n".join(re.sub(r"\s*\n\s*", " ", p.strip()) for p in paragraphs if p.strip())
        text = re.sub(r" +,", ",", text)
        text = re.sub(r"  +", " ", text)  # where the pronunciation was
        yield f"gcide@{off}", text


def perl_doc():
    """Perl's manual pages in POD."""
    for path in sorted(glob.glob(f"{PERL_POD}/*.pod")):
        yield path, read(path)


def git_doc():
    """Git's manual pages and guides in AsciiDoc."""
    for path in sorted(glob.glob(f"{GIT_DOC}/**/*.txt", recursive=True)):
        yield path, read(path)


def gnu_standards():
    """The GNU Coding Standards and Information for Maintainers of GNU Software, plain text."""
    for path in sorted(glob.glob(f"{GNU_STANDARDS}/*.text.gz")):
        yield path, read(path)


SOURCES = {
    "linux-doc-6.1": linux_doc,
    "python3.11-doc": python_doc,
    "debian-handbook": debian_handbook,
    "dict-gcide": gcide,
    "perl-doc": perl_doc,
    "git-doc": git_doc,
    "gnu-standards": gnu_standards,
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seen = set()
    stats = {}
    for name, source in SOURCES.items():
        s = stats[name] = {"documents": 0, "bytes": 0, "skipped_not_utf8": 0, "skipped_duplicate": 0, "skipped_short": 0}
        tmp = os.path.join(out, "." + name + ".jsonl.tmp")  # dot: `prepare` skips it if left behind
        with open(tmp, "w", encoding="utf-8") as f:
            for path, text in source():
                if text is None:
                    s["skipped_not_utf8"] += 1
                    continue
                text = tidy(text)
                # Stubs and empty index pages carry no prose; a dictionary entry is short by nature.
                if len(text) < (24 if name == "dict-gcide" else 64):
                    s["skipped_short"] += 1
                    continue
                digest = hashlib.sha256(text.encode()).digest()
                if digest in seen:  # the same page shipped twice
                    s["skipped_duplicate"] += 1
                    continue
                seen.add(digest)
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                s["documents"] += 1
                s["bytes"] += len(text.encode())
        os.replace(tmp, os.path.join(out, name + ".jsonl"))
        print(f"corpus: {name}: {s['documents']} documents, {s['bytes'] / 1e6:.1f} MB", file=sys.stderr)
    with open(sys.argv[2], "w") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
