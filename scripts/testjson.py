#!/usr/bin/env python3
"""go test -json on stdin, printed as go test prints without -v, and each
top-level test's time kept.

scripts/gotest.sh runs every go test through it, so that a run tells how
long each test took (its slowest list, and the weights in
scripts/test-weights.txt that split a package between processes) without
the log lines of every passing test that -v would print. A failed test's
lines, and those of a test still running when its package failed (a
timeout's panic), are printed whole; lines that are not JSON (a build
failure) pass through. A line naming a drawn seed (CDC_..._SEED) is
printed as it comes, pass or fail, so that a run can be replayed.

Usage: testjson.py TIMES_FILE  (appends "package test seconds" lines)
"""
import json
import re
import sys

times = open(sys.argv[1], "a")
held = {}  # (package, top-level test) -> its output lines, while it runs
NOISE = ("=== RUN", "=== PAUSE", "=== CONT", "=== NAME")
SEED = re.compile(r"CDC_[A-Z]+_SEED")


def out(line):
    sys.stdout.write(line)
    sys.stdout.flush()


for raw in sys.stdin:
    try:
        ev = json.loads(raw)
    except ValueError:
        out(raw)
        continue
    if not isinstance(ev, dict):
        out(raw)
        continue
    pkg, test, action = ev.get("Package", ""), ev.get("Test"), ev.get("Action")
    if action == "build-output" or action == "build-fail":
        out(ev.get("Output", ""))
        continue
    if test is None:
        if action == "output":
            line = ev.get("Output", "")
            if line.strip() not in ("PASS",) and not line.startswith(NOISE):
                out(line)
        elif action == "fail":
            # Tests still running when the package failed: a timeout's
            # panic names one of them; show what each printed.
            for (p, t), lines in list(held.items()):
                if p == pkg:
                    out("".join(lines))
                    del held[(p, t)]
        continue
    top = test.split("/")[0]
    key = (pkg, top)
    if action == "output":
        line = ev.get("Output", "")
        if SEED.search(line):
            out(line)
        elif not line.startswith(NOISE):
            held.setdefault(key, []).append(line)
    elif action in ("pass", "fail", "skip") and test == top:
        lines = held.pop(key, [])
        if action == "fail":
            out("".join(lines))
        if "Elapsed" in ev:
            times.write("%s %s %.1f\n" % (pkg, top, ev["Elapsed"]))
            times.flush()
