#!/usr/bin/env python3
"""bench/summarize.py on small result files written here (CTest runs it with the cpu label)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "summarize.py")


def result(suite, name, value, size, precision, fraction=None):
    return {"schema": 1, "suite": suite, "name": name, "metric": "throughput", "value": value, "unit": "TFLOP/s",
            "peak": None, "fraction": fraction, "params": {"m": size, "n": size, "k": size, "precision": precision,
                                                           "p10": value * 0.99, "p90": value * 1.01, "verified": "exact"},
            "gpu": {"name": "Test GPU", "sm_clock": 1980, "mem_clock": 3201, "driver": "580"}, "git": "abc123",
            "time": "2026-11-29T20:00:00Z"}


class Summarize(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.run_json = self.write("run.json", [
            result("gemm", "cublaslt_bf16_8192", 800.0, 8192, "bf16", 0.809),
            result("gemm", "cublaslt_fp8e4m3_8192", 1300.0, 8192, "fp8e4m3"),
            result("gemm", "ladder4_mma_sync_bf16_8192", 420.0, 8192, "bf16"),
            result("gemm", "ladder5_wgmma_bf16_8192", 600.0, 8192, "bf16"),
            result("gemm", "cublaslt_bf16_4096", 10.0, 4096, "bf16"),
            result("memory", "hbm_copy", 4200.0, 0, "-"),
        ])
        self.peer_json = self.write("peer.json", [
            result("gemm_peer_torch", "torch_bf16_8192", 820.0, 8192, "bf16"),
            result("gemm_peer_torch", "torch_fp8e4m3_8192", 1400.0, 8192, "fp8e4m3"),
        ])
        self.info_json = self.write("info.json", {"devices": []})  # not a result array: skipped

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            json.dump(data, f)
        return path

    def run_script(self, *args):
        done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout

    def row(self, text, first_cell):
        rows = [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]
        self.assertEqual(len(rows), 1, text)
        return [c.strip() for c in rows[0].strip("|").split("|")]

    def test_gemm_summary_pairs_library_with_peer_and_ladder_with_library(self):
        out = self.run_script("--gemm-summary", self.run_json, self.peer_json, self.info_json)
        bf16 = self.row(out, "cublaslt_bf16")
        self.assertEqual(bf16[1:], ["800", "80.9 %", "-", "820", "0.976", "≥ 95 % of torch.matmul", "yes"])
        fp8 = self.row(out, "cublaslt_fp8e4m3")
        self.assertEqual(fp8[4:], ["1400", "0.929", "≥ 95 % of torch._scaled_mm", "no"])
        mma = self.row(out, "ladder4_mma_sync_bf16")
        self.assertEqual(mma[3], "52.5 %")
        self.assertEqual(mma[6:], ["≥ 50 % of cuBLASLt bf16", "yes"])
        wgmma = self.row(out, "ladder5_wgmma_bf16")
        self.assertEqual(wgmma[3], "75.0 %")
        self.assertEqual(wgmma[7], "no")
        self.assertNotIn("4096", out.split("\n\n")[0].split("\n", 1)[1])  # only the asked size
        self.assertIn("Test GPU, SM clock 1980 MHz", out)
        self.assertIn("git abc123", out)

    def test_gemm_summary_other_size_and_missing_size(self):
        out = self.run_script("--gemm-summary", "--size", "4096", self.run_json)
        self.assertEqual(self.row(out, "cublaslt_bf16")[1], "10.0")
        self.assertIn("no gemm figures at 1024³", self.run_script("--gemm-summary", "--size", "1024", self.run_json))

    def test_all_tables_one_per_suite_and_file(self):
        out = self.run_script(self.run_json, self.peer_json, self.info_json)
        self.assertIn("### gemm (run.json)", out)
        self.assertIn("### memory (run.json)", out)
        self.assertIn("### gemm_peer_torch (peer.json)", out)
        self.assertNotIn("info.json", out)
        self.assertEqual(self.row(out, "ladder4_mma_sync_bf16_8192")[1:5], ["420", "TFLOP/s", "-", "416 .. 424"])


if __name__ == "__main__":
    unittest.main()
