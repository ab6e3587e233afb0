"""What a callback costs a real MindSpore training step (not a test):

    python python/bench/bench_mindspore_callback.py [HUB] [STEPS] [ROUNDS]
    python python/bench/bench_mindspore_callback.py [HUB] --overhead
    python python/bench/bench_mindspore_callback.py [HUB] [STEPS] [ROUNDS] --blocks

A 3-layer MLP on CPU in graph mode, warmup + cosine ``LearningRateSchedule``, trained with
``Model.train`` in seven configurations, interleaved round by round so each sees the same
machine noise: no callback; an empty callback; the reference design's callback (loss
``asnumpy``, the schedule read for the step, a CSV row flushed every 10); ours on a plain
``Model(net, loss, opt)`` (the lr from the schedule, evaluated in chunks); and with
``TrainOneStepWithGradNorm`` (loss, grad norm and lr from the graph): no callback, an empty
callback, ours.

A step's cost is the steady state: the time from step ``WARM`` to the last step's end over
the steps between (a clock callback placed last), so a run's start (the hub's hello) and its
end (``finish`` waiting for the hub's acknowledgements, printed apart) are not spread over
its steps. Prints per configuration the median over rounds, the cost over the empty callback
on the same graph as the median of the per-round differences (each round's two runs are
minutes apart at most) with its standard error, and the time spent inside the callback's
step hooks (measured around them). `--overhead` times the hooks alone, on outputs already
on the host: what the callback itself costs.

Separate runs differ by more than the callback costs (each compiles its own graph and lays
out its own memory: medians of one configuration move by 0.1-0.3 ms between runs on a 2-core
machine). `--blocks` (also printed after the table) measures the train-cell path without
that: one training run per round, our callback switched on and off every ``BLOCK`` steps
(off: an empty callback), each "on" block compared with the mean of the "off" blocks on
either side of it; the median of those differences over every block of every round, with
its standard error.
"""

import csv
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Model, nn
from mindspore.train import Callback

from stepstream.mindspore import StepStreamCallback, TrainOneStepWithGradNorm

# The tests' warmup + cosine schedule cell, with this benchmark's longer warmup.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from mstrain import WarmupCosine  # noqa: E402

ms.set_context(mode=ms.GRAPH_MODE)
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
HUB = ARGS[0] if ARGS else "ws://127.0.0.1:7070"
STEPS = int(ARGS[1]) if len(ARGS) > 1 else 1500
ROUNDS = int(ARGS[2]) if len(ARGS) > 2 else 5
PEAK, WARMUP = 0.05, 100
WARM = min(100, STEPS // 4)


class Empty(Callback):
    def on_train_step_end(self, run_context):
        pass


class Reference(Callback):
    """The reference design's callback: per step, the loss to the host, the schedule read,
    a CSV row; flushed every 10 rows."""

    def __init__(self, path):
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(["step", "timestamp", "loss", "lr"])

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        out = p.net_outputs
        loss = float((out[0] if isinstance(out, (tuple, list)) else out).asnumpy())
        opt = p.optimizer or p.train_network.optimizer
        lr = float(opt.learning_rate(opt.global_step - 1).asnumpy())
        self.w.writerow([p.cur_step_num, time.time(), loss, lr])
        if p.cur_step_num % 10 == 0:
            self.f.flush()


def dataset(n, batch=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n * batch, 64)).astype(np.float32)
    y = rng.normal(size=(n * batch, 8)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch)


def model(with_cell: bool):
    ms.set_seed(1)
    net = nn.SequentialCell(nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 8))
    opt = nn.Momentum(net.trainable_params(), learning_rate=WarmupCosine(STEPS, PEAK, WARMUP), momentum=0.9)
    if with_cell:
        return Model(TrainOneStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt))
    return Model(net, nn.MSELoss(), opt)


SELF_TIME = {}
ENDS = {}


class Clock(Callback):
    """Placed last: when step ``WARM`` and the last step ended."""

    def __init__(self):
        self.at = {}

    def on_train_step_end(self, run_context):
        n = run_context.original_args().cur_step_num
        if n in (WARM, STEPS):
            self.at[n] = time.perf_counter()


def self_timed(cb, name):
    """Wraps a callback's step hooks to add up the time spent in them."""
    for hook in ("on_train_step_begin", "on_train_step_end"):
        inner = getattr(cb, hook)

        def wrapped(run_context, inner=inner):
            t = time.perf_counter()
            inner(run_context)
            SELF_TIME.setdefault(name, []).append(time.perf_counter() - t)

        setattr(cb, hook, wrapped)
    end = cb.on_train_end

    def ended(run_context, end=end):
        t = time.perf_counter()
        end(run_context)
        ENDS.setdefault(name, []).append(time.perf_counter() - t)

    cb.on_train_end = ended
    return cb


def timed(name, tmp):
    data = dataset(STEPS)
    m = model(name.endswith("(train cell)"))
    callbacks = {
        "no callback": [],
        "no callback (train cell)": [],
        "empty callback": [Empty()],
        "empty callback (train cell)": [Empty()],
        "reference design": [Reference(os.path.join(tmp, "ref.csv"))],
        "ours (Model(net, loss, opt))": [StepStreamCallback(hub=HUB, project="bench", name="ms-callback",
                                                            archive_dir=tmp, system_metrics=False)],
        "ours (train cell)": [StepStreamCallback(hub=HUB, project="bench", name="ms-callback-cell",
                                                 archive_dir=tmp, system_metrics=False)],
    }[name]
    clock = Clock()
    callbacks = [self_timed(cb, name) for cb in callbacks] + [clock]
    # Compile outside the timing: one short epoch first.
    m.train(1, dataset(20), callbacks=[], dataset_sink_mode=False)
    m.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    return (clock.at[STEPS] - clock.at[WARM]) / (STEPS - WARM) * 1000


BLOCK = 100


def blocks():
    """Our callback on the train-cell path, on and off in alternate blocks of one run."""

    class Switched(Callback):
        """Ours on odd blocks; an empty callback on even ones."""

        def __init__(self, ours):
            self.ours = ours

        def on_train_begin(self, run_context):
            self.ours.on_train_begin(run_context)

        def on_train_end(self, run_context):
            self.ours.on_train_end(run_context)

        def _on(self, run_context):
            # The step about to run (begin) or that ran (end) is in an "on" block.
            return (run_context.original_args().cur_step_num - 1) // BLOCK % 2 == 1

        def on_train_step_begin(self, run_context):
            if self._on(run_context):
                self.ours.on_train_step_begin(run_context)

        def on_train_step_end(self, run_context):
            if self._on(run_context):
                self.ours.on_train_step_end(run_context)

    class Ends(Callback):
        def __init__(self):
            self.at = []

        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num % BLOCK == 0:
                self.at.append(time.perf_counter())

    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(ROUNDS):
            m = model(True)
            m.train(1, dataset(20), callbacks=[], dataset_sink_mode=False)
            ours = StepStreamCallback(hub=HUB, project="bench", name="ms-callback-blocks", archive_dir=tmp,
                                      system_metrics=False)
            ends = Ends()
            m.train(1, dataset(STEPS), callbacks=[Switched(ours), ends], dataset_sink_mode=False)
            per_step = [(b - a) / BLOCK * 1000 for a, b in zip(ends.at, ends.at[1:])]
            # per_step[i] is block i + 1 (block 0 has no start time); odd blocks are "on".
            # Blocks 1 and 2 are the warm-up.
            for i in range(3, len(per_step) - 1):
                if (i + 1) % 2 == 1:
                    diffs.append(per_step[i] - (per_step[i - 1] + per_step[i + 1]) / 2)
            print(f"blocks round {r + 1}/{ROUNDS} done", file=sys.stderr)
    cost = statistics.median(diffs)
    error = 1.25 * statistics.stdev(diffs) / len(diffs) ** 0.5
    print(f"Train cell, ours on and off every {BLOCK} steps of one run, {len(diffs)} blocks "
          f"({ROUNDS} runs of {STEPS} steps): {cost:+.3f} +- {error:.3f} ms/step over the empty callback")


def overhead():
    """The callback's own cost, without a device: its hooks called 3,000 times on a step's
    outputs already on the host. In training the hooks also wait for the step the runtime is
    still computing asynchronously, time the step would take anyway."""

    class Params(dict):
        __getattr__ = dict.get

    class Context:
        def __init__(self, p):
            self.p = p

        def original_args(self):
            return self.p

        def request_stop(self):
            # What a stop command does; none is sent here.
            pass

    loss = ms.Tensor(np.float32(0.5))
    batch = ms.Tensor(np.zeros((32, 64), np.float32))
    p = Params(net_outputs=loss, cur_step_num=1, cur_epoch_num=1, batch_num=1000,
               train_dataset_element=[batch], optimizer=None, train_network=None)
    with tempfile.TemporaryDirectory() as tmp:
        cb = StepStreamCallback(hub=HUB, project="bench", name="ms-callback-overhead", archive_dir=tmp,
                                system_metrics=False)
        cb.on_train_begin(Context(p))
        cb._lr_reader = lambda step: 1e-3  # a schedule read from its chunk: a list index
        empty = Empty()
        for name, hooks in [("empty callback", (empty.on_train_step_end,)),
                            ("ours", (cb.on_train_step_begin, cb.on_train_step_end))]:
            t = time.perf_counter()
            for i in range(1, 3001):
                p["cur_step_num"] = i
                for h in hooks:
                    h(Context(p))
            print(f"  {name:30s} {(time.perf_counter() - t) / 3000 * 1e6:7.1f} us/step in its hooks, no device")
        cb.run.finish(timeout=30)


def main():
    if "--overhead" in sys.argv:
        overhead()
        return
    if "--blocks" in sys.argv:
        blocks()
        return
    names = ["no callback", "empty callback", "reference design", "ours (Model(net, loss, opt))",
             "no callback (train cell)", "empty callback (train cell)", "ours (train cell)"]
    results = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(ROUNDS):
            # Each round starts at another configuration: no position in a round is favoured.
            for n in names[r % len(names):] + names[:r % len(names)]:
                results[n].append(timed(n, tmp))
            print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
    print(f"MindSpore {ms.__version__}, steps {WARM}..{STEPS} x {ROUNDS} interleaved rounds, medians:")
    for n in names:
        m = statistics.median(results[n])
        empty = "empty callback (train cell)" if n.endswith("(train cell)") else "empty callback"
        diffs = [a - b for a, b in zip(results[n], results[empty])]
        cost = statistics.median(diffs)
        # The standard error of a median: ~1.25 sigma / sqrt(n).
        error = 1.25 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        own = sum(SELF_TIME.get(n, [])) / (STEPS * ROUNDS) * 1000
        end = f"   train end {statistics.median(ENDS[n]) * 1000:5.0f} ms" if n in ENDS else ""
        print(f"  {n:30s} {m:7.3f} ms/step   {cost:+6.3f} +- {error:5.3f} ms over the empty callback"
              f" (same graph)   in its hooks {own:6.3f} ms/step{end}")

    blocks()
    print("The callback alone:")
    overhead()


if __name__ == "__main__":
    main()
