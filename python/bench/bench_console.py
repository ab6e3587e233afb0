"""What capturing the console costs a training loop, and whether it keeps up (not a test):

    stepstream serve --limit console_lines=2000000 &   # keep every line of the benchmark
    python python/bench/bench_console.py HUB [SECONDS]

Runs the same loop in child processes, alternately with ``console=True`` and ``False``
(twice each, so both see the same machine noise): every step does ~1 ms of CPU work and
prints 10 lines, i.e. 10,000 lines a second, for SECONDS (default 60) seconds; stdout goes
to a file in both cases, as a job's log would. Prints each configuration's median step time
and the ratio, and checks that every line printed with capture is on the hub, once, in order.

Then the cost of ``stepstream.Histogram`` on the calling thread, per call, for a 10M-element
float32 tensor (PyTorch on CPU: the computation itself runs on the calling thread; on an
accelerator only the kernels' launch does) and a numpy array, median of 20 calls.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HUB = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:7070"
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0

CHILD = r"""
import json, sys, time
import stepstream
hub, capture, seconds, run_id = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3]), sys.argv[4]
run = stepstream.init(hub=hub, name="console-bench", run_id=run_id, archive_dir=None,
                      system_metrics=False, console=capture)
def work(seconds):
    end = time.perf_counter() + seconds
    x = 0.0
    while time.perf_counter() < end:
        x += 1.0
    return x
times = []
start = time.perf_counter()
step = 0
while time.perf_counter() - start < seconds:
    t0 = time.perf_counter()
    work(0.001)
    for i in range(10):
        print(f"step {step} line {i}: loss 0.1234 lr 0.001")
    run.log({"loss": 0.1}, step=step)
    times.append(time.perf_counter() - t0)
    step += 1
sys.stdout.flush()
report = run.finish()
print(json.dumps({"steps": step, "median_ms": 1000 * sorted(times)[len(times) // 2],
                  "report": report}), file=sys.stderr)
"""


def one(capture: bool, n: int):
    run_id = f"console-bench-{int(time.time())}-{n}-{int(capture)}"
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as out, \
            tempfile.NamedTemporaryFile("w+", suffix=".py") as script:
        script.write(CHILD)
        script.flush()
        proc = subprocess.run([sys.executable, script.name, HUB, "1" if capture else "0", str(SECONDS), run_id],
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=SECONDS * 4 + 120)
        result = json.loads(proc.stderr.strip().splitlines()[-1])
        out.seek(0)
        printed = out.read().splitlines()
    result["printed"] = len(printed)
    if capture:
        http = HUB.replace("ws://", "http://").replace("wss://", "https://")
        got = []
        last = (0, -1)
        step = 0
        # The whole console, a page at a time (the API answers at most 100,000 lines): each
        # page from the last step seen, keeping the lines after the last one seen.
        while True:
            with urllib.request.urlopen(f"{http}/api/runs/{run_id}/console?from_step={step}&limit=100000") as r:
                page = json.load(r)
            lines = [l for l in page["lines"] if (l["seq"], l["idx"]) > last]
            got += [l["text"] for l in lines]
            if not page["more"] or not lines:
                break
            last = (lines[-1]["seq"], lines[-1]["idx"])
            step = lines[-1]["step"]
        result["received_by_hub"] = page["total"]
        result["stored"] = len(got)
        result["in_order"] = got == printed
        result["dropped_by_hub"] = page["dropped"]
    return result


def histograms():
    import numpy as np
    import torch

    import stepstream

    out = {}
    t = torch.randn(10_000_000)
    a = t.numpy()
    for name, value in (("torch_cpu_10M", t), ("numpy_10M", a)):
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            stepstream.Histogram(value, bins=64)
            times.append(time.perf_counter() - t0)
        out[name + "_us"] = round(1e6 * statistics.median(times))
    small = torch.randn(1000)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        stepstream.Histogram(small, bins=64)
        times.append(time.perf_counter() - t0)
    out["torch_cpu_1k_us"] = round(1e6 * statistics.median(times))
    return out


def main():
    results = {"off": [], "on": []}
    for n in range(2):
        for capture in (False, True):
            r = one(capture, n)
            results["on" if capture else "off"].append(r)
            print(("on " if capture else "off"), json.dumps({k: v for k, v in r.items() if k != "report"}), flush=True)
    off = statistics.median(r["median_ms"] for r in results["off"])
    on = statistics.median(r["median_ms"] for r in results["on"])
    lines_per_s = statistics.median(r["steps"] * 10 / SECONDS for r in results["on"])
    print(json.dumps({
        "seconds": SECONDS,
        "lines_per_second_printed": round(lines_per_s),
        "step_ms_without_capture": round(off, 4),
        "step_ms_with_capture": round(on, 4),
        "ratio": round(on / off, 4),
        "every_line_received": all(r["received_by_hub"] == r["printed"] for r in results["on"]),
        "every_line_stored_in_order": all(r["in_order"] for r in results["on"]),
    }))
    print(json.dumps(histograms()))


if __name__ == "__main__":
    main()
