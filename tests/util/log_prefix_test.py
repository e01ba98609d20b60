#!/usr/bin/env python3
"""No message given to util::Log starts with "kvtier": Log prefixes every line with
"kvtier: <level>: " itself, so a message of its own "kvtier: cache: ..." printed
"kvtier: warning: kvtier: cache: ..." (issue 36 probe 10). Scans the C++ sources under the
directories given (default: src, tools and python/src of the repository) and lists each call.

Usage: log_prefix_test.py [DIR...]
"""
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# util::Log(util::LogLevel::kWarning, "kvtier: ...", ...), the format possibly on the next line.
CALL = re.compile(r'\bLog\(\s*(?:util::)?LogLevel::k\w+,\s*"(kvtier\b[^"]*)"')


def main():
    roots = sys.argv[1:] or [os.path.join(REPO, d) for d in ("src", "tools", "python/src")]
    found, files = [], 0
    for root in roots:
        for directory, _, names in os.walk(root):
            for name in names:
                if not name.endswith((".cc", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(directory, name)
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in CALL.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append('%s:%d: "%s"' % (os.path.relpath(path, REPO), line, m.group(1)))
    if files == 0:
        print("FAIL: no C++ source under %s" % " ".join(roots))
        return 1
    for f in found:
        print("FAIL: a Log message that repeats Log's own 'kvtier: <level>: ' prefix: " + f)
    if not found:
        print("PASS: %d files, no Log message starts with 'kvtier'" % files)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
