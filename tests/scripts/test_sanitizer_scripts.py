#!/usr/bin/env python3
"""scripts/compute_sanitizer.sh, sanitizer_coverage.py and sanitizer_queues.sh, on a machine without a GPU.

Stand-ins for `ctest` (it lists the gpu tests below) and `compute-sanitizer` (it prints what the
real tool prints for each kind of run, from its documented output) go first on PATH, and for
sanitizer_queues.sh also `cmake` and `nvidia-smi`. The scripts' summary lines, verdicts and
coverage counts must follow from those logs. CTest runs this with the cpu label.
"""
import os
import re
import shutil
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPUTE_SANITIZER = os.path.join(ROOT, "scripts", "compute_sanitizer.sh")
COVERAGE = os.path.join(ROOT, "scripts", "sanitizer_coverage.py")
QUEUES = os.path.join(ROOT, "scripts", "sanitizer_queues.sh")
TOOLS = ("memcheck", "racecheck", "initcheck")
TESTS = ("Fake.Clean", "Fake.OneRace", "Fake.LibraryRace", "Fake.LibraryAndOurReads", "Fake.Hangs", "Fake.Skips",
         "Fake.SanitizerFails", "Fake.NoCudaCall", "Fake.ChildKilled", "Fake.EndsMidTest", "Fake/Param.Named/0")

# Lists TESTS as `ctest -L gpu --show-only=json-v1` does: one command per test.
FAKE_CTEST = """#!/usr/bin/env python3
import json, sys
assert "-L" in sys.argv and "gpu" in sys.argv and "--show-only=json-v1" in sys.argv, sys.argv
build = sys.argv[sys.argv.index("--test-dir") + 1]
tests = {tests!r}
print(json.dumps({{"tests": [{{"name": t, "command": [build + "/tests/test_fake_gpu", "--gtest_filter=" + t]}}
                             for t in tests]}}))
"""

# The tool's output for one run: `compute-sanitizer --tool T ... exe --gtest_filter=NAME`.
FAKE_SANITIZER = r"""#!/usr/bin/env bash
while (($#)); do
  case $1 in
    --tool) tool=$2; shift 2 ;;
    --kernel-name-exclude) unchecked=$2; shift 2 ;;
    --gtest_filter=*) name=${1#*=}; shift ;;
    *) shift ;;
  esac
done
echo "env: GPULAB_SANITIZER=${GPULAB_SANITIZER-unset} GPULAB_NVJPEG_HARDWARE=${GPULAB_NVJPEG_HARDWARE-unset}"
[[ -n ${unchecked-} ]] && echo "unchecked kernels: $unchecked"
passed() { echo "[  PASSED  ] 1 test."; }
clean() {
  passed
  if [[ $tool == racecheck ]]; then echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
  else echo "========= ERROR SUMMARY: 0 errors"; fi
  exit 0
}
case "$name/$tool" in
  Fake.OneRace/racecheck)
    echo "========= Error: Race reported between Write access at reduce_kernel(float *)+0x90"
    echo "=========     and Read access at reduce_kernel(float *)+0xd0 [32 hazards]"
    passed
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    exit 99 ;;
  Fake.LibraryRace/racecheck)  # as session 34's cuDNN dgrad reports: no host frame, the kernel names cuDNN
    [[ -n ${unchecked-} && sm90_xmma_dgrad_implicit_gemm_bf16_cudnn =~ ${unchecked#regex=} ]] && clean  # left out
    echo "========= Error: Race reported between Write access at sm90_xmma_dgrad_implicit_gemm_bf16_cudnn+0x8d30"
    echo "=========     and Read access at sm90_xmma_dgrad_implicit_gemm_bf16_cudnn+0xae30 [128 hazards]"
    passed
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    exit 99 ;;
  Fake.LibraryAndOurReads/initcheck)
    echo "========= Uninitialized __global__ memory read of size 2 bytes"
    echo "=========     at bn_fw_tr_1C11_kernel_NCHW+0x400"
    echo "=========     Host Frame: [0x2f0f3f] in libcuda.so.1"
    echo "=========     Host Frame: cudnnBatchNormalizationForwardTraining [0x1d1] in libcudnn_ops.so.9"
    echo "========= Uninitialized __global__ memory read of size 4 bytes"
    echo "=========     at rope_kernel+0x120"
    echo "=========     Host Frame: [0x2f0f3f] in libcuda.so.1"
    echo "=========     Host Frame: [0x15f2b] in libcudart.so.13"
    echo "=========     Host Frame: gpulab::kernels::rope(...) [0x8a11] in test_fake_gpu"
    passed
    echo "========= ERROR SUMMARY: 2 errors"
    exit 99 ;;
  Fake.Hangs/memcheck)
    echo "========= Invalid __global__ read of size 4 bytes"
    echo "=========     at gather_kernel+0x70"
    echo "=========     Host Frame: gpulab::gather(...) [0x42] in test_fake_gpu"
    exec sleep 60 ;;
  Fake.Skips/*)
    echo "[  SKIPPED ] Fake.Skips (0 ms)"
    clean ;;
  Fake.SanitizerFails/initcheck)
    echo "========= Internal Sanitizer Error: The Sanitizer encountered an error while launching the application"
    exit 255 ;;
  Fake.NoCudaCall/memcheck)  # as session 40's CPU-only 7B test: passed, and the tool never attached
    echo "========= Error: No attachable process found. compute-sanitizer timed-out."
    echo "========= Default timeout can be adjusted with --launch-timeout. Awaiting target completion."
    passed
    exit 255 ;;
  Fake.ChildKilled/racecheck)
    echo "[  FAILED  ] Fake.ChildKilled (3 ms)"
    echo "========= Error: process didn't terminate successfully"
    echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    exit 1 ;;
  Fake.EndsMidTest/racecheck)  # as session 35's training tests, four at once: the program ended with no verdict
    echo "[ RUN      ] Fake.EndsMidTest"
    python3 -c 'held = b"x" * (600 << 20)'  # a program that takes 600 MiB of host memory
    echo "========= Error: Race reported between Write access at sm90_xmma_dgrad_implicit_gemm_bf16_cudnn+0x8d30"
    echo "=========     and Read access at sm90_xmma_dgrad_implicit_gemm_bf16_cudnn+0xae30 [64 hazards]"
    echo "========= Error: process didn't terminate successfully"
    echo "========= Target application returned an error"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
    exit 99 ;;
  *) clean ;;
esac
"""


def write_executable(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class SanitizerScripts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpulab_sanitizer_scripts_")
        bin_dir = os.path.join(cls.dir, "bin")
        cls.build = os.path.join(cls.dir, "build")
        os.makedirs(bin_dir)
        os.makedirs(os.path.join(cls.build, "tests"))
        write_executable(os.path.join(bin_dir, "ctest"), FAKE_CTEST.format(tests=list(TESTS)))
        write_executable(os.path.join(bin_dir, "compute-sanitizer"), FAKE_SANITIZER)
        cls.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], CUDA_VISIBLE_DEVICES="0")
        cls.env.pop("GPULAB_NVJPEG_HARDWARE", None)
        cls.env.pop("GPULAB_SANITIZER", None)
        cls.status, cls.stdout, cls.logs, cls.rows = cls.run_script("out", "--tools", " ".join(TOOLS), "--jobs", "4",
                                                                    "--timeout", "3")

    @classmethod
    def run_script(cls, out, *args):
        """compute_sanitizer.sh's exit status, output, log folder and {(test, tool): (exit, note)}."""
        env = dict(cls.env, OUT=os.path.join(cls.dir, out))
        run = subprocess.run([COMPUTE_SANITIZER, "--build", cls.build, *args], env=env, capture_output=True, text=True,
                             timeout=120)
        logs = os.path.join(cls.dir, out, "compute-sanitizer")
        rows = {}
        with open(os.path.join(logs, "summary.txt"), encoding="utf-8") as f:
            header = f.readline().split()
            assert header == ["test", "tool", "exit", "sec", "errors"], header
            for line in f:
                test, tool, code, _seconds, note = line.split(None, 4)
                rows[(test, tool)] = (code if code == "-" else int(code), note.strip())
        return run.returncode, run.stdout + run.stderr, logs, rows

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def row(self, test, tool):
        self.assertIn((test, tool), self.rows, self.stdout)
        return self.rows[(test, tool)]

    def test_every_test_and_tool_has_one_line(self):
        self.assertEqual(set(self.rows), {(t, tool) for t in TESTS for tool in TOOLS}, self.stdout)

    def test_clean_runs_report_zero(self):
        for tool in TOOLS:
            self.assertEqual(self.row("Fake.Clean", tool), (0, "0"))
            self.assertEqual(self.row("Fake/Param.Named/0", tool), (0, "0"))

    def test_a_single_race_counts_as_one_error(self):
        # racecheck's summary is singular for one hazard: "1 hazard displayed (1 error, ...".
        code, note = self.row("Fake.OneRace", "racecheck")
        self.assertEqual(code, 99)
        self.assertTrue(note.startswith("1 "), note)
        self.assertIn("[printed: 0 ours, 0 libraries, 1 without a host frame]", note)

    def test_a_race_without_host_frames_in_a_library_kernel_is_the_librarys(self):
        self.assertEqual(self.row("Fake.LibraryRace", "racecheck"),
                         (99, "1 [printed: 0 ours, 1 libraries, 0 without a host frame]"))

    def test_reports_are_attributed_to_the_first_frame_past_the_cuda_runtime(self):
        code, note = self.row("Fake.LibraryAndOurReads", "initcheck")
        self.assertEqual((code, note), (99, "2 [printed: 1 ours, 1 libraries, 0 without a host frame]"))

    def test_a_timed_out_run_counts_the_reports_it_printed(self):
        code, note = self.row("Fake.Hangs", "memcheck")
        self.assertEqual(code, 124)
        self.assertTrue(note.startswith("1 printed (timed out)"), note)

    def test_a_skipped_test_says_so(self):
        self.assertEqual(self.row("Fake.Skips", "memcheck"), (0, "0 (skipped)"))

    def test_an_internal_sanitizer_error_is_not_judged(self):
        code, note = self.row("Fake.SanitizerFails", "initcheck")
        self.assertEqual(code, 125)
        self.assertIn("not judged", note)

    def test_a_program_with_no_cuda_call_is_not_judged(self):
        self.assertEqual(self.row("Fake.NoCudaCall", "memcheck"), (125, "0 (no CUDA call to check: not judged)"))

    def test_a_killed_child_is_a_failure_not_a_report(self):
        self.assertEqual(self.row("Fake.ChildKilled", "racecheck"), (1, "0 (test failed)"))

    def test_a_program_that_ends_mid_test_says_so_behind_its_reports(self):
        # The tool's 99 would otherwise read as "the test passed, with reports". Its host memory
        # peak (600 MiB and the interpreter) is the clue to why, and smaller peaks are not shown.
        code, note = self.row("Fake.EndsMidTest", "racecheck")
        self.assertEqual(code, 99)
        self.assertRegex(note, r"^1 \[printed: 0 ours, 1 libraries, 0 without a host frame\]"
                               r" \(no test verdict: ended mid-test\) \(host memory peak 0\.6 GiB\)$")

    def test_each_log_ends_with_its_largest_process_peak_memory(self):
        with open(os.path.join(self.logs, "Fake.Clean.memcheck.log"), encoding="utf-8") as f:
            last = f.read().splitlines()[-1]
        kib = int(re.fullmatch(r"compute_sanitizer\.sh: peak resident memory of the largest process: (\d+) KiB",
                               last).group(1))
        self.assertGreater(kib, 0)
        self.assertLess(kib, 512 * 1024)  # so its summary line does not show it
        self.assertEqual(self.row("Fake.Clean", "memcheck"), (0, "0"))

    def test_each_run_names_its_tool_and_initcheck_and_racecheck_leave_out_the_jpeg_engine(self):
        for tool in TOOLS:
            with open(os.path.join(self.logs, f"Fake.Clean.{tool}.log"), encoding="utf-8") as f:
                first = f.readline()
            hardware = "0" if tool in ("initcheck", "racecheck") else "unset"
            self.assertEqual(first.strip(), f"env: GPULAB_SANITIZER={tool} GPULAB_NVJPEG_HARDWARE={hardware}")
        self.assertTrue(os.path.exists(os.path.join(self.logs, "Fake_Param.Named_0.racecheck.log")))

    def test_the_exit_status_and_totals(self):
        self.assertEqual(self.status, 1, self.stdout)  # runs with reports or failures
        total = re.search(r"(\d+) runs, (\d+) with errors or failures, (\d+) timed out, (\d+) not judged, (\d+) not run",
                          self.stdout)
        self.assertIsNotNone(total, self.stdout)
        # Failures: OneRace, LibraryRace, LibraryAndOurReads, ChildKilled, EndsMidTest.
        self.assertEqual(tuple(map(int, total.groups())), (len(TESTS) * len(TOOLS), 5, 1, 2, 0))

    def test_a_deadline_ends_the_running_run_and_lists_the_rest_as_not_run(self):
        status, stdout, _logs, rows = self.run_script("deadline", "--tools", "memcheck racecheck", "--jobs", "1",
                                                      "--timeout", "60", "--deadline", "5",
                                                      "--only", r"^Fake\.(Clean|Hangs)$")
        self.assertEqual(rows[("Fake.Clean", "memcheck")], (0, "0"), stdout)
        self.assertEqual(rows[("Fake.Clean", "racecheck")], (0, "0"), stdout)
        code, note = rows[("Fake.Hangs", "memcheck")]  # it hangs: ended at the deadline, not after 60 s
        self.assertEqual(code, 124, stdout)
        self.assertTrue(note.startswith("1 printed (timed out)"), note)
        self.assertEqual(rows[("Fake.Hangs", "racecheck")], ("-", "not run (--deadline)"), stdout)
        self.assertIn("4 runs, 0 with errors or failures, 1 timed out, 0 not judged, 1 not run", stdout)
        self.assertEqual(status, 0, stdout)

    def test_shortest_first_orders_runs_by_their_last_recorded_seconds(self):
        results = os.path.join(self.dir, "timings")
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, "2026-01-01-sanitizer.txt"), "w", encoding="utf-8") as f:
            f.write("test tool exit sec errors\n"
                    "Fake.Clean memcheck 0 50 0\n"
                    "Fake.Clean racecheck 0 1 0\n"
                    "Fake.Skips memcheck 0 5 0 (skipped)\n"
                    "Fake.OneRace memcheck 0 200 0\n"
                    "Fake.OneRace memcheck - 0 not run (--deadline)\n")  # not run: no time of its own
        _status, stdout, logs, _rows = self.run_script("ordered", "--tools", "memcheck racecheck", "--jobs", "1",
                                                       "--timeout", "2", "--shortest-first", results,
                                                       "--only", r"^Fake\.(Clean|OneRace|Hangs|Skips)$")
        with open(os.path.join(logs, "summary.txt"), encoding="utf-8") as f:
            order = [tuple(line.split()[:2]) for line in f][1:]
        # Racecheck's own 1 s; Skips' memcheck 5 s for both tools; 50 s; Hangs never ran (120 s);
        # OneRace's 200 s. Equal times keep ctest's order.
        self.assertEqual(order, [("Fake.Clean", "racecheck"), ("Fake.Skips", "memcheck"), ("Fake.Skips", "racecheck"),
                                 ("Fake.Clean", "memcheck"), ("Fake.Hangs", "memcheck"), ("Fake.Hangs", "racecheck"),
                                 ("Fake.OneRace", "memcheck"), ("Fake.OneRace", "racecheck")], stdout)

    def test_left_runs_only_the_pairs_without_a_clean_or_library_only_run_on_record(self):
        # Two folders of records, as bench/results and a device session's own earlier summaries.
        committed, session = os.path.join(self.dir, "left-committed"), os.path.join(self.dir, "left-session")
        for folder, lines in ((committed, "Fake.Clean memcheck 0 3 0\n"
                                          "Fake.Skips memcheck 0 1 0 (skipped)\n"   # skipped: not clean
                                          "Fake.OneRace racecheck 99 4 1\n"       # reported: not clean
                                          # every report printed and a library's: not rerun
                                          "Fake.Hangs racecheck 99 40 2 [printed: 0 ours, 2 libraries,"
                                          " 0 without a host frame]\n"),
                              (session, "Fake.Clean racecheck 0 9 0\n"
                                        "Fake.OneRace memcheck 124 60 0 printed (timed out)\n")):
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "s-sanitizer.txt"), "w", encoding="utf-8") as f:
                f.write("test tool exit sec errors\n" + lines)
        _status, stdout, _logs, rows = self.run_script("left", "--tools", "memcheck racecheck", "--jobs", "2",
                                                       "--timeout", "2", "--left", committed, "--left", session,
                                                       "--only", r"^Fake\.(Clean|OneRace|Skips|Hangs)$")
        self.assertEqual(set(rows), {("Fake.OneRace", "memcheck"), ("Fake.OneRace", "racecheck"),
                                     ("Fake.Skips", "memcheck"), ("Fake.Skips", "racecheck"),
                                     ("Fake.Hangs", "memcheck")}, stdout)
        # Nothing left to run is not an error.
        done = subprocess.run([COMPUTE_SANITIZER, "--build", self.build, "--tools", "memcheck racecheck",
                               "--left", committed, "--left", session, "--only", r"^Fake\.Clean$"],
                              env=dict(self.env, OUT=os.path.join(self.dir, "left-none")), capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("every selected (test, tool) pair has a clean run on record", done.stdout)

    def coverage(self, *args, results=None):
        return subprocess.run(["python3", COVERAGE, "--build", self.build, "--results", results or self.logs, *args],
                              env=self.env, capture_output=True, text=True, check=True).stdout

    def test_coverage_counts_only_clean_finished_unskipped_runs(self):
        results = os.path.join(self.dir, "results")
        os.makedirs(results, exist_ok=True)
        shutil.copy(os.path.join(self.logs, "summary.txt"), os.path.join(results, "fake-sanitizer.txt"))
        # A run that checked only some kernels never counts.
        with open(os.path.join(results, "fake-kernel-filter-sanitizer.txt"), "w", encoding="utf-8") as f:
            f.write("Fake.OneRace racecheck 0 1 0\n")
        # Library kernels' reports only, every one printed: "library only", with a memory note too.
        # 60 reports of which 50 were printed: the other 10 could be ours.
        with open(os.path.join(results, "more-sanitizer.txt"), "w", encoding="utf-8") as f:
            f.write("Fake.Skips racecheck 99 40 2 [printed: 0 ours, 2 libraries, 0 without a host frame]"
                    " (host memory peak 61.2 GiB)\n")
            f.write("Fake.OneRace racecheck 99 50 60 [printed: 0 ours, 50 libraries, 0 without a host frame]\n")
        table = self.coverage(results=results)
        counts = {m.group(1): tuple(map(int, m.groups()[1:]))
                  for m in re.finditer(r"^(memcheck|synccheck|initcheck|racecheck)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$",
                                       table, re.M)}
        n = len(TESTS)
        # Never clean: Skips under every tool; Hangs and NoCudaCall under memcheck; OneRace,
        # LibraryRace (a library's report is still a report), ChildKilled and EndsMidTest under
        # racecheck; LibraryAndOurReads and SanitizerFails under initcheck; synccheck never ran.
        # "Library only" under racecheck: LibraryRace and the added Skips run; EndsMidTest's reports
        # are a library's too, but its test gave no verdict. They are still left for --left, which
        # asks for clean runs.
        self.assertEqual(counts, {"memcheck": (n - 3, 0, 0, 3), "synccheck": (0, 0, 0, n),
                                  "initcheck": (n - 3, 0, 0, 3), "racecheck": (n - 5, 2, 0, 3)}, table)
        left = self.coverage("--left", "racecheck", results=results).strip()
        self.assertEqual(left, r"^(Fake\.OneRace|Fake\.LibraryRace|Fake\.Skips|Fake\.ChildKilled|Fake\.EndsMidTest)$")
        # A second folder's clean run counts beside the first's.
        later = os.path.join(self.dir, "results-later")
        os.makedirs(later, exist_ok=True)
        with open(os.path.join(later, "later-sanitizer.txt"), "w", encoding="utf-8") as f:
            f.write("Fake.ChildKilled racecheck 0 30 0\n")
        left = self.coverage("--left", "racecheck", "--results", later, results=results).strip()
        self.assertEqual(left, r"^(Fake\.OneRace|Fake\.LibraryRace|Fake\.Skips|Fake\.EndsMidTest)$")

    def test_racecheck_ours_leaves_the_library_kernels_unchecked_and_counts_apart(self):
        status, stdout, logs, rows = self.run_script("ours", "--tools", "racecheck-ours", "--jobs", "2", "--timeout",
                                                     "5", "--only", r"^Fake\.(Clean|OneRace|LibraryRace)$")
        # The library's race goes unseen; ours is still found.
        ours, race = "racecheck-ours", "1 [printed: 0 ours, 0 libraries, 1 without a host frame]"
        self.assertEqual(rows, {("Fake.Clean", ours): (0, "0"), ("Fake.LibraryRace", ours): (0, "0"),
                                ("Fake.OneRace", ours): (99, race)}, stdout)
        self.assertEqual(status, 1, stdout)
        with open(os.path.join(logs, "Fake.Clean.racecheck-ours.log"), encoding="utf-8") as f:
            self.assertEqual([f.readline().strip(), f.readline().strip()],
                             ["env: GPULAB_SANITIZER=racecheck GPULAB_NVJPEG_HARDWARE=0",
                              "unchecked kernels: regex=nccl|cudnn|xmma|cublas|nvjet|nvjpeg"])
        # Counted apart: not where racecheck itself ran clean (Clean) or found a library's reports
        # only (LibraryRace), nor when it reported (OneRace).
        results = os.path.join(self.dir, "ours-results")
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, "a-sanitizer.txt"), "w", encoding="utf-8") as f:
            f.write("Fake.Clean racecheck 0 3 0\n"
                    "Fake.LibraryRace racecheck 99 40 1 [printed: 0 ours, 1 libraries, 0 without a host frame]\n"
                    "Fake.Hangs racecheck 124 600 2 printed (timed out)\n")
        shutil.copy(os.path.join(logs, "summary.txt"), os.path.join(results, "b-sanitizer.txt"))
        with open(os.path.join(results, "b-sanitizer.txt"), "a", encoding="utf-8") as f:
            f.write("Fake.Hangs racecheck-ours 0 80 0\n")
        racecheck = re.search(r"^racecheck\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", self.coverage(results=results), re.M)
        self.assertEqual(tuple(map(int, racecheck.groups())), (1, 1, 1, len(TESTS) - 3))
        self.assertEqual(self.coverage("--left", "racecheck", results=results).count("|"), len(TESTS) - 2)
        left = self.coverage("--left", "racecheck-ours", results=results).strip()
        self.assertNotRegex(left, r"Clean|LibraryRace|Hangs")
        self.assertIn(r"Fake\.OneRace", left)
        # compute_sanitizer.sh --left likewise runs racecheck-ours only where nothing counts.
        _status, stdout, _logs, rows = self.run_script("ours-left", "--tools", "racecheck-ours", "--left", results,
                                                       "--only", r"^Fake\.(Clean|OneRace|LibraryRace|Hangs|Skips)$")
        self.assertEqual(set(rows), {("Fake.OneRace", "racecheck-ours"), ("Fake.Skips", "racecheck-ours")}, stdout)

    def queue_call(self, call, *queues):
        """sanitizer_queues.sh's call `call`: {queue header: {(test, tool): exit}} from its summary file."""
        stand_ins = os.path.join(self.dir, "queue-bin")
        os.makedirs(stand_ins, exist_ok=True)
        write_executable(os.path.join(stand_ins, "cmake"), "#!/bin/sh\necho cmake \"$@\"\n")
        write_executable(os.path.join(stand_ins, "nvidia-smi"), "#!/bin/sh\necho 'Fake GPU, 1 MiB'\n")
        results = os.path.join(self.dir, "queue-results")  # nothing on record
        os.makedirs(results, exist_ok=True)
        out = os.path.join(self.dir, f"queue-out{call}")
        env = dict(self.env, PATH=stand_ins + os.pathsep + self.env["PATH"], CALL=str(call), LIMIT="100", OUT=out,
                   BUILD=self.build, RESULTS=results, QUEUES_DIR=os.path.join(self.dir, "queue-work"))
        run = subprocess.run([QUEUES, *queues], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["build.log", f"call{call}-logs.tgz", f"call{call}-memory.log",
                                                   f"call{call}-sanitizer.txt"])
        queues_run, header = {}, None
        with open(os.path.join(out, f"call{call}-sanitizer.txt"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("## "):
                    header = line.strip()
                    queues_run[header] = {}
                elif not line.startswith("compute_sanitizer.sh"):
                    test, tool, code = line.split()[:3]
                    queues_run[header][(test, tool)] = int(code)
        return queues_run

    def test_queues_run_beside_each_other_and_a_later_call_leaves_out_what_ran_clean(self):
        both = r"a;memcheck racecheck;2;5;^Fake\.(Clean|OneRace)$"
        others = r"b;memcheck;1;5;^Fake\.;Clean|Race|Library|Hangs|Sanitizer|NoCuda|Child|Ends|Param"
        first = self.queue_call(1, both, others)
        self.assertEqual(first, {
            r"## call 1, queue a: memcheck racecheck, --jobs 2, --timeout 5, --only '^Fake\.(Clean|OneRace)$'": {
                ("Fake.Clean", "memcheck"): 0, ("Fake.Clean", "racecheck"): 0, ("Fake.OneRace", "memcheck"): 0,
                ("Fake.OneRace", "racecheck"): 99},
            r"## call 1, queue b: memcheck, --jobs 1, --timeout 5, --only '^Fake\.', --exclude "
            r"'Clean|Race|Library|Hangs|Sanitizer|NoCuda|Child|Ends|Param'": {("Fake.Skips", "memcheck"): 0}})
        # Call 2 counts call 1's clean runs, except in a queue marked `all`.
        second = self.queue_call(2, both, r"c;memcheck;1;5;^Fake\.Clean$;;all")
        self.assertEqual(second, {
            r"## call 2, queue a: memcheck racecheck, --jobs 2, --timeout 5, --only '^Fake\.(Clean|OneRace)$'": {
                ("Fake.OneRace", "racecheck"): 99},
            r"## call 2, queue c: memcheck, --jobs 1, --timeout 5, --only '^Fake\.Clean$' (every pair, clean on "
            r"record or not)": {("Fake.Clean", "memcheck"): 0}})


if __name__ == "__main__":
    unittest.main()
