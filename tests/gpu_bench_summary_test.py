#!/usr/bin/env python3
"""tools/gpu_bench_summary.py against a committed sample of llm.c's stdout (ctest
`gpu_bench_summary`): the parser reads train_gpt2cu's step lines as llm.c's printf formats write
them, skips the warm-up, and the MFU it reports by our formula agrees with the MFU llm.c printed
for the same steps (the same 6 N + 6 L C T count and, in the fixture, the same peak) — so a change
to the formula, the parameter count or the parsing shows here. The fixture
(tests/data/llmc_train_gpt2cu_stdout.txt) is hand-made from the format strings, not a run.

    python3 tests/gpu_bench_summary_test.py [-v]
"""
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gpu_bench_summary as g  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "data", "llmc_train_gpt2cu_stdout.txt")
SCRIPT = os.path.join(ROOT, "tools", "gpu_bench_summary.py")


def fixture_text():
    with open(FIXTURE) as f:
        return f.read()


class ParseLlmcLog(unittest.TestCase):
    def test_fixture_gives_the_median_mean_and_tokens_of_the_steps_after_warmup(self):
        r = g.parse_llmc_log(fixture_text(), skip=3)
        self.assertNotIn("error", r)
        self.assertEqual((r["B"], r["T"], r["steps"], r["warmup_skipped"]), (16, 1024, 9, 3))
        # Steps 4..12 of the fixture: 70.1 70.5 69.8 70.2 71.0 70.0 70.4 70.3 69.9 ms.
        self.assertAlmostEqual(r["ms_per_step_median"], 70.2, places=9)
        self.assertAlmostEqual(r["ms_per_step_mean"], 632.2 / 9, places=9)
        self.assertAlmostEqual(r["tokens_per_s"], 16 * 1024 / (632.2 / 9 / 1e3), places=3)
        self.assertAlmostEqual(r["llmc_mfu_median"], 0.19, places=9)
        self.assertAlmostEqual(r["final_loss"], 10.9518, places=9)
        self.assertEqual(r["device_mem_used_mib"], 9731)
        self.assertEqual(r["device"], "NVIDIA H100 80GB HBM3")
        self.assertEqual(r["preset"], "gpt2-124M")

    def test_our_parameter_count_is_llmcs(self):
        # llm.c's d12 prints num_parameters 124475904 (padded vocabulary 50304, wpe included).
        r = g.parse_llmc_log(fixture_text(), skip=3)
        self.assertEqual(g.llmc_parameters(12, 768, 50304, 1024), r["num_parameters"])
        self.assertEqual(g.flops_per_token("gpt2-124M", 1024), 6 * 124475904 + 6 * 12 * 768 * 1024)

    def test_our_mfu_matches_the_mfu_llmc_printed_at_the_same_peak(self):
        r = g.parse_llmc_log(fixture_text(), skip=3)
        ours = r["tokens_per_s"] * g.flops_per_token("gpt2-124M", r["T"]) / (r["llmc_peak_tflops"] * 1e12)
        # llm.c's is the median of per-step figures printed to 0.1 %; ours comes from the mean step.
        self.assertAlmostEqual(ours, r["llmc_mfu_median"], delta=0.002)

    def test_skipping_changes_what_is_measured(self):
        r = g.parse_llmc_log(fixture_text(), skip=0)
        self.assertEqual(r["steps"], 12)
        self.assertGreater(r["ms_per_step_mean"], 90)  # the 412 ms first step is in

    def test_unknown_gpu_prints_minus_100_percent_and_gives_no_own_mfu(self):
        text = re.sub(r"[0-9.]+% bf16 MFU", "-100.0% bf16 MFU", fixture_text())
        self.assertEqual(text.count("-100.0% bf16 MFU"), 12)
        self.assertIsNone(g.parse_llmc_log(text, skip=3)["llmc_mfu_median"])

    def test_a_log_without_timed_steps_is_an_error_quoting_its_end(self):
        crashed = "\n".join(l for l in fixture_text().splitlines() if not l.startswith("step"))
        crashed += "\n[CUDA ERROR] at file llmc/cuda_utils.cuh:219:\nout of memory\n"
        r = g.parse_llmc_log(crashed, skip=3)
        self.assertIn("error", r)
        self.assertIn("0 step lines", r["error"])
        self.assertIn("out of memory", r["error"])
        r = g.parse_llmc_log(fixture_text(), skip=12)
        self.assertIn("12 step lines", r["error"])

    def test_cli_prints_one_json_line_marked_dry(self):
        out = subprocess.run([sys.executable, SCRIPT, "--parse-llmc", FIXTURE, "--label", "its own",
                              "--commit", "f1e2ace6", "--skip", "3", "--dry"],
                             check=True, capture_output=True, text=True).stdout
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 1)
        r = json.loads(lines[0])
        self.assertEqual((r["impl"], r["attention"], r["commit"], r["dry"]), ("llm.c", "its own", "f1e2ace6", True))

    def test_cli_on_a_missing_log_prints_an_error_line(self):
        out = subprocess.run([sys.executable, SCRIPT, "--parse-llmc", "/nonexistent/llmc.log"],
                             check=True, capture_output=True, text=True).stdout
        self.assertIn("cannot read /nonexistent/llmc.log", json.loads(out)["error"])


def microtrain_results(B, median_ms, mfu, peak):
    """The parts of a results.json that the summary reads."""
    return {
        "experiment": {"rounds": 3},
        "comparison": {"baseline": "flash", "variants": [{"variant": "flash", "is_baseline": True}]},
        "variants": [{
            "name": "flash", "status": "ok", "device_name": "NVIDIA H100 80GB HBM3",
            "batch": {"batch_size": B},
            "stats": {"step_ms": {"median": median_ms, "p10": median_ms - 1, "p90": median_ms + 1},
                      "tokens_per_s": B * 1024 / (median_ms / 1e3)},
            "flops": {"mfu": mfu, "peak_per_s": peak, "peak_source": "data sheet"},
            "memory": {"device": {"peak_used_bytes": 20 * 2**30}},
            "loss": {"final": 10.98},
        }],
    }


class SummaryTable(unittest.TestCase):
    def test_rows_grouped_by_batch_with_peer_mfu_from_microtraints_peak(self):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for B, ms in ((32, 140.0), (16, 72.0)):
                p = os.path.join(d, f"r{B}.json")
                with open(p, "w") as f:
                    json.dump(microtrain_results(B, ms, 0.2, 989.4e12), f)
                paths.append(p)
            llmc = g.parse_llmc_log(fixture_text(), skip=3)
            llmc.update({"attention": "its own", "commit": "f1e2ace6"})
            torch = {"impl": "pytorch", "torch": "2.11.0", "compile": True, "attention": "sdpa", "preset": "gpt2-124M",
                     "B": 32, "T": 1024, "ms_per_step_median": 150.0, "ms_per_step_mean": 150.0,
                     "tokens_per_s": 32 * 1024 / 0.150, "final_loss": 10.99, "peak_mem_mib": 30000}
            failed = {"impl": "llm.c", "attention": "cuDNN", "B": 32, "error": "make failed\nno cudnn.h"}
            peers = os.path.join(d, "peers.jsonl")
            with open(peers, "w") as f:
                for p in (torch, llmc, failed):
                    f.write(json.dumps(p) + "\n")
            args = type("A", (), {"microtrain": paths + [os.path.join(d, "missing.json")], "peers": peers,
                                  "peer_peak_tflops": None, "peer_peak_source": ""})
            buf = io.StringIO()
            with redirect_stdout(buf):
                g.summary(args)
            out = buf.getvalue()
        rows = [l for l in out.splitlines() if l.startswith("| ") and not l.startswith("| run")]
        self.assertEqual([r.split(" | ")[1] for r in rows], ["16", "16", "32", "32", "32"])
        self.assertTrue(rows[0].startswith("| microtrain `flash` | 16 |"))
        llmc_row = next(r for r in rows if r.startswith("| llm.c f1e2ace"))
        # 233,243 tokens/s x 803,478,528 FLOP per token / 989.4 TFLOP/s = 18.9 %; llm.c printed 19.0 %.
        self.assertIn("| 233,243 | 18.9 % | 19.0 % | 9731 | 10.9518 |", llmc_row)
        self.assertIn("70.20 (69.88–70.60)", llmc_row)
        torch_row = next(r for r in rows if r.startswith("| PyTorch"))
        self.assertIn("torch.compile", torch_row)
        self.assertIn("| 218,453 | 17.7 % |", torch_row)
        failed_row = next(r for r in rows if "cuDNN" in r)
        self.assertIn("no numbers: make failed / no cudnn.h", failed_row)


if __name__ == "__main__":
    unittest.main()
