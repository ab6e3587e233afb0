"""Micro-benchmark of `run.log` (not a test): python python/bench/bench_log.py [HUB]

Reports, in one run, the cost of logging 10 scalars (median of many timed batches, in
microseconds per call, by the calling thread's CPU time and by the wall clock) of steps
whose values change as a training run's do, three ways: an empty Python call taking the same arguments (the floor
any logger pays), the reference design (a `csv.writer` row, flushed every 10 rows, and a
`queue.Queue.put` for a sender thread), and `run.log`; each net of the empty call, and the
ratio. Then the slowdown of a ~2 ms CPU-bound training-step loop with logging on versus off,
interleaved so both see the same machine noise.
"""

import csv
import math
import os
import random
import queue
import statistics
import sys
import tempfile
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
    # What a training loop logs: values that change every step (a noisy decaying loss, a
    # warm-up then cosine lr, ...), each step a dict with the same keys. Built beforehand
    # and cycled, so the timed loops pay only the call.
    rng = random.Random(0)

    def at(step):
        loss = 2.0 * math.exp(-step / 4000) + 0.3 + rng.gauss(0, 0.02)
        lr = 3e-4 * min(1.0, step / 500) * 0.5 * (1 + math.cos(math.pi * (step % 10000) / 10000))
        ms = 50 + rng.random() * 5
        return {"loss": loss, "lr": lr, "grad_norm": abs(rng.gauss(1.0, 0.3)),
                "samples_per_sec": 256 / ms * 1e3, "tokens_per_sec": 256 * 2048 / ms * 1e3,
                "ppl": math.exp(loss), "loss_scale": 65536.0, "step_time": ms / 1e3,
                "data_wait": rng.random() * 1e-3, "epoch": step / 5000}

    steps = [at(i) for i in range(4096)]
    metrics = dict(steps[0])
    log = run.log
    step = 0
    for _ in range(20000):  # warm up (name cache, queue)
        log(steps[step & 4095], step=step)
        step += 1
    def empty(m, step=None):
        pass

    # The reference design (SEED.md): a CSV row per step, flushed every 10, and the row put
    # on a bounded in-memory queue (5000, drop oldest) for the service.
    f = open(os.path.join(tempfile.mkdtemp(), "ref.csv"), "w", newline="")
    writer = csv.writer(f)
    writer.writerow(["step", "timestamp", *names])
    outbox = queue.Queue(maxsize=5000)

    def reference(m, step=None):
        row = [step, time.time(), *m.values()]
        writer.writerow(row)
        if step % 10 == 0:
            f.flush()
        if outbox.full():
            outbox.get_nowait()  # drop the oldest
        outbox.put_nowait(row)

    # Round robin, one timed batch of each in turn: all three see the same machine noise.
    # Two clocks: the calling thread's CPU time (what the training thread pays, whatever
    # else the machine runs: here the hub and the sender thread share its two cores) and
    # the wall clock (which also counts the thread being preempted meanwhile). Two
    # workloads: the training-like steps, and one dict of constant values every step (the
    # cheapest case for the reference, whose cost is mostly formatting numbers).
    designs = [("empty call", empty), ("reference design", reference), ("run.log", log)]
    constant = {n: 0.5 for n in names}
    for workload, pick in [("training-like values", lambda i: steps[i & 4095]),
                           ("the same values every step", lambda i: constant)]:
        cpu = {name: [] for name, _ in designs}
        wall = {name: [] for name, _ in designs}
        for _ in range(300):
            for name, fn in designs:
                batch = [pick(i) for i in range(step, step + 500)]
                t, c = time.perf_counter_ns(), time.thread_time_ns()
                for m in batch:
                    fn(m, step=step)
                    step += 1
                cpu[name].append((time.thread_time_ns() - c) / 500 / 1000)
                wall[name].append((time.perf_counter_ns() - t) / 500 / 1000)
        for clock, samples in [("thread CPU time", cpu), ("wall clock", wall)]:
            results = {name: statistics.median(v) for name, v in samples.items()}
            floor = results["empty call"]
            print(f"{workload}, {clock}:")
            for name, v in results.items():
                print(f"  {name:17s} {v:6.2f} us/call   net of the empty call {v - floor:6.2f} us")
            ours, ref = results["run.log"] - floor, results["reference design"] - floor
            print(f"  run.log costs 1/{ref / ours:.1f} of the reference design, net of the empty call")

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
