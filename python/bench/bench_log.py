"""Micro-benchmark of `run.log` (not a test): python python/bench/bench_log.py [HUB]

Reports the cost of one `run.log` with 10 scalars (median of many timed batches, in
microseconds per call), and the slowdown of a ~2 ms CPU-bound training-step loop with
logging on versus off, interleaved so both see the same machine noise.
"""

import statistics
import sys
import time

import stepstream

HUB = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:7070"


def busy(seconds):
    end = time.perf_counter() + seconds
    x = 0.0
    while time.perf_counter() < end:
        x += 1.0
    return x


def main():
    run = stepstream.init(hub=HUB, project="bench", name="log-cost", archive_dir="/tmp/stepstream-bench",
                          system_metrics=False)
    names = ["loss", "lr", "grad_norm", "samples_per_sec", "tokens_per_sec", "ppl", "loss_scale",
             "step_time", "data_wait", "epoch"]
    metrics = {n: 0.5 for n in names}
    log = run.log
    step = 0
    for _ in range(20000):  # warm up (name cache, queue)
        log(metrics, step=step)
        step += 1
    per_call = []
    for _ in range(200):
        t = time.perf_counter_ns()
        for _ in range(500):
            log(metrics, step=step)
            step += 1
        per_call.append((time.perf_counter_ns() - t) / 500 / 1000)
    print(f"run.log with 10 scalars: median {statistics.median(per_call):.2f} us/call "
          f"(p10 {sorted(per_call)[20]:.2f}, p90 {sorted(per_call)[180]:.2f})")

    on, off = [], []
    for rep in range(10):
        for logging in (rep % 2 == 0, rep % 2 == 1):
            t = time.perf_counter()
            for _ in range(250):
                busy(0.002)
                if logging:
                    metrics["loss"] = step * 1e-6
                    log(metrics, step=step)
                    step += 1
            (on if logging else off).append(time.perf_counter() - t)
    slow = (statistics.median(on) / statistics.median(off) - 1) * 100
    print(f"2 ms step loop: logging on {statistics.median(on) * 4:.3f} ms/step, off "
          f"{statistics.median(off) * 4:.3f} ms/step: slowdown {slow:+.2f}%")
    report = run.finish(timeout=120)
    print(f"delivered={report['delivered']} acked={report['acked']} dropped={report['dropped']}")


if __name__ == "__main__":
    main()
