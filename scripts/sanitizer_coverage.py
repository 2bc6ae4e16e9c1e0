#!/usr/bin/env python3
"""Which (gpu test, compute-sanitizer tool) pairs have a clean run on record, and which do not.

    scripts/sanitizer_coverage.py [--build DIR] [--results DIR ...]      # the table
    scripts/sanitizer_coverage.py --left racecheck                        # an --only regex

The tests are those `ctest -L gpu` lists in the build (--build, default build). The record is
every `*sanitizer*.txt` in bench/results (--results, which may be given more than once, as for a
device session's own summaries beside the committed ones): the summary tables
scripts/compute_sanitizer.sh prints, one line per run: test, tool, exit status, seconds, errors.
A run counts as clean only when it exited 0, reported no error and did not skip. Files named
`*kernel-filter*` come from runs that checked only some kernels, and never count.

racecheck checks a kernel's own shared memory, so a hazard it reports inside a kernel of NVIDIA's
libraries (cuDNN's sm90 dgrad kernels, cuBLASLt's: compute_sanitizer.sh names them by kernel) is in
that kernel's code, whatever we pass it, and we cannot change it. A racecheck pair with no clean
run but a run whose test passed and whose every report was printed and is in such a kernel is
counted apart, as "library only": none of our kernels raced there. It is not clean.

A clean run of the pseudo-tool racecheck-ours (compute_sanitizer.sh: racecheck with the libraries'
kernels left unchecked, where a full run outlasts a device call) says that none of our kernels
raced, and nothing of the libraries' kernels. A racecheck pair with neither a clean nor a "library
only" run but such a run is counted apart again, as "ours only". It is not clean either.

With --left TOOL it prints, instead of the table, a regex of the tests without a clean TOOL run,
for `scripts/compute_sanitizer.sh --tools TOOL --only "$(...)"`; --left racecheck-ours, those with
no racecheck pair counted clean, "library only" or "ours only".
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

TOOLS = ("memcheck", "synccheck", "initcheck", "racecheck")
OURS_ONLY = "racecheck-ours"


def gpu_tests(build):
    listing = subprocess.run(["ctest", "--test-dir", build, "-L", "gpu", "--show-only=json-v1"],
                             check=True, capture_output=True, text=True).stdout
    names = []
    for test in json.loads(listing)["tests"]:
        for arg in test.get("command") or []:
            if arg.startswith("--gtest_filter="):
                names.append(arg.split("=", 1)[1])
    return names


def records(results):
    """Each run line of the summaries in `results` (a folder or a list of them) as (fields, line):
    test, tool, exit, seconds, errors; folders in the order given, each one's files in name order,
    so a later session's line comes after an earlier one's."""
    folders = [results] if isinstance(results, str) else results
    for path in (p for d in folders for p in sorted(glob.glob(os.path.join(d, "*sanitizer*.txt")))):
        if "kernel-filter" in os.path.basename(path):
            continue
        for line in open(path, encoding="utf-8"):
            fields = line.split()
            if len(fields) >= 5 and fields[0] != "test" and fields[1] in TOOLS + (OURS_ONLY,):
                yield fields, line


def clean_runs(results):
    return {(f[0], f[1]) for f, line in records(results) if f[2] == "0" and f[4] == "0" and "skipped" not in line}


# A whole racecheck note whose reports were all printed and all in library kernels, and nothing else
# (no timeout, failure, missing verdict, skip) but the host memory peak.
LIBRARY_ONLY_NOTE = re.compile(r"(\d+) \[printed: 0 ours, (\d+) libraries, 0 without a host frame\]"
                               r"( \(host memory peak [0-9.]+ GiB\))?")


def library_only_runs(results):
    pairs = set()
    for f, line in records(results):
        note = LIBRARY_ONLY_NOTE.fullmatch(line.split(None, 4)[4].strip())
        if f[1] == "racecheck" and f[2] == "99" and note and note.group(1) == note.group(2):
            pairs.add((f[0], f[1]))
    return pairs


def last_seconds(results):
    """{(test, tool): seconds} of each pair's latest run that started ("-": not run). A timed-out
    run's seconds are a lower bound."""
    return {(f[0], f[1]): int(f[3]) for f, _ in records(results) if f[2] != "-" and f[3].isdigit()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--results", action="append", help="a folder of summaries (default bench/results); repeatable")
    ap.add_argument("--left", choices=TOOLS + (OURS_ONLY,),
                    help="print a regex of the tests without a clean run of this tool")
    args = ap.parse_args()
    tests = gpu_tests(args.build)
    if not tests:
        sys.exit(f"sanitizer_coverage.py: no gpu tests in {args.build}")
    results = args.results or [os.path.join(os.path.dirname(__file__), "..", "bench", "results")]
    clean = clean_runs(results)
    library_only = library_only_runs(results) - clean
    ours_only = {(t, "racecheck") for t, tool in clean if tool == OURS_ONLY} - clean - library_only
    if args.left:
        counted = clean if args.left != OURS_ONLY else clean | library_only | ours_only
        left = [t for t in tests if (t, args.left.removesuffix("-ours")) not in counted]
        print("^(" + "|".join(re.escape(t) for t in left) + ")$" if left else "^$")
        return
    print(f"{len(tests)} gpu tests")
    print(f"{'tool':10} {'clean':>6} {'library only':>13} {'ours only':>10} {'left':>6}")
    for tool in TOOLS:
        done = sum((t, tool) in clean for t in tests)
        libraries = sum((t, tool) in library_only for t in tests)
        ours = sum((t, tool) in ours_only for t in tests)
        print(f"{tool:10} {done:6d} {libraries:13d} {ours:10d} {len(tests) - done - libraries - ours:6d}")


if __name__ == "__main__":
    main()
