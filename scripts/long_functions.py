#!/usr/bin/env python3
"""scripts/long_functions.py — the functions longer than N lines (default 100) in tools/ and
python/src (issue 39: none without a reason in its comment), longest first.

    scripts/long_functions.py [N] [FOLDER...]

Reads clang-formatted C++ as text: a definition is a line at indentation 0 or 2 that ends in '{'
and whose signature (back to the previous ';', '{', '}', blank or comment line) has a '(' and is
not a control statement, a class or an initializer; its body ends at the next '}' at the same
indentation. Lambdas inside a function count in that function. A function whose comment (the
lines just above it) says "long:" and why is listed with that reason. Prints "LINES FILE:LINE
NAME"; exit code 0 (a listing, not a check).
"""
import glob
import re
import sys

CONTROL = re.compile(r"\s*(if|for|while|switch|namespace|class|struct|enum|else|do|union)\b")


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^( *)(\S.*)\{$", lines[i])
        if m and len(m.group(1)) <= 2:
            indent, start = m.group(1), i
            signature = lines[i]
            while start > 0 and not re.search(r"[;{}]\s*$|^\s*$|^\s*//", lines[start - 1]):
                start -= 1
                signature = lines[start] + " " + signature
            if "(" in signature and not CONTROL.match(signature) and \
                    "=" not in signature.split("(")[0]:
                end = i + 1
                while end < len(lines) and not lines[end].startswith(indent + "}"):
                    end += 1
                name = re.search(r"([\w:~]+)\s*\(", signature)
                comment = []
                k = start - 1
                while k >= 0 and lines[k].strip().startswith("//"):
                    comment.insert(0, lines[k].strip()[2:].strip())
                    k -= 1
                reason = " ".join(comment)
                reason = reason[reason.find("long:"):] if "long:" in reason else ""
                yield end - start + 1, start + 1, name.group(1) if name else signature[:40], reason
                i = end
        i += 1


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    folders = sys.argv[2:] or ["tools", "python/src"]
    rows = []
    for folder in folders:
        for ext in ("cc", "h", "cu"):
            for path in glob.glob("%s/**/*.%s" % (folder, ext), recursive=True):
                for n, line, name, reason in functions(path):
                    if n > limit:
                        rows.append((n, path, line, name, reason))
    for n, path, line, name, reason in sorted(rows, reverse=True):
        print("%4d %s:%d %s%s" % (n, path, line, name, ("  (" + reason + ")") if reason else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
