#!/usr/bin/env python3
"""scripts/long_functions.py — the functions longer than N lines (default 100) in tools/ and
python/src (issue 39: none without a reason in its comment), longest first.

    scripts/long_functions.py [--check] [N] [FOLDER...]

With --check (scripts/setup.sh test runs it), exit code 1 when one of them has no reason.

Reads clang-formatted C++ as text: a definition is a line that ends in '{' whose signature (back to
the previous ';', '{', '}', blank, comment or access-specifier line) starts at indentation 0 or 2 (a
wrapped signature's last line is indented further), has a '(' and is not a control statement, a
class or an initializer; its body ends at the next '}' at the signature's indentation. Python files
(.py) are measured from their syntax tree. Lambdas inside a function count in that function. A
function whose comment (the lines just above it) says "long:" and why is listed with that reason.
Prints "LINES FILE:LINE NAME"; exit code 0 (a listing) unless --check.
"""
import ast
import glob
import os
import re
import sys

CONTROL = re.compile(r"\s*(if|for|while|switch|namespace|class|struct|enum|else|do|union)\b")


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].endswith("{"):
            start = i
            signature = lines[i]
            while start > 0 and not re.search(r"[;{}]\s*$|^\s*$|^\s*//|^\s*(public|protected|private):",
                                                 lines[start - 1]):
                start -= 1
                signature = lines[start] + " " + signature
            indent = re.match(r"^( *)", lines[start]).group(1)
        if lines[i].endswith("{") and len(indent) <= 2:
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


def python_functions(path):
    """The same for a Python file, from its syntax tree (a reason after "long:" in the
    docstring)."""
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node) or ""
            reason = " ".join(doc[doc.find("long:"):].split()) if "long:" in doc else ""
            yield node.end_lineno - node.lineno + 1, node.lineno, node.name, reason


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    limit = int(args[0]) if args else 100
    folders = args[1:]
    if not folders:  # the repository's, wherever it is run from
        os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        folders = ["tools", "python/src"]
    rows = []
    for folder in folders:
        for ext in ("cc", "h", "cu", "cuh", "cc.in", "py"):
            for path in glob.glob("%s/**/*.%s" % (folder, ext), recursive=True):
                read = python_functions if ext == "py" else functions
                for n, line, name, reason in read(path):
                    if n > limit:
                        rows.append((n, path, line, name, reason))
    for n, path, line, name, reason in sorted(rows, reverse=True):
        print("%4d %s:%d %s%s" % (n, path, line, name, ("  (" + reason + ")") if reason else ""))
    unexplained = [r for r in rows if not r[4]]
    if check and unexplained:
        print("%d function(s) over %d lines without a reason: split them by what their parts do, or "
              "say why in a comment above (\"long: ...\"); docs/architecture.md, \"A long function\""
              % (len(unexplained), limit))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
