"""A tiny real MindSpore training (16-32-4 MLP, CPU, graph mode) used by the tests.

Run as a script it trains slowly (for the SIGKILL test): python mstrain.py HUB ARCHIVE STEPS.
"""

import math
import sys
import time

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Model, nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.train import Callback

from stepstream.mindspore import (
    StepStreamCallback,
    TrainOneStepWithGradNorm,
    TrainOneStepWithLossScaleGradNorm,
)

ms.set_context(mode=ms.GRAPH_MODE)

PEAK, WARMUP = 0.05, 5


def schedule(k, total):
    """Warmup then cosine: the lr the optimizer applies at step k + 1 (global step k)."""
    if k < WARMUP:
        return PEAK * (k + 1) / WARMUP
    t = min(max((k - WARMUP) / max(total - WARMUP, 1), 0.0), 1.0)
    return PEAK * 0.5 * (1.0 + math.cos(math.pi * t))


class WarmupCosine(LearningRateSchedule):
    """`schedule` as a MindSpore schedule cell (elementwise: a vector of steps works too)."""

    def __init__(self, total, peak=PEAK, warmup=WARMUP):
        super().__init__()
        self.total, self.peak, self.warmup = float(total), float(peak), float(warmup)

    def construct(self, global_step):
        s = ops.cast(global_step, ms.float32)
        warm = self.peak * (s + 1.0) / self.warmup
        t = ops.clip_by_value((s - self.warmup) / (self.total - self.warmup), 0.0, 1.0)
        cos = self.peak * 0.5 * (1.0 + ops.cos(math.pi * t))
        is_warm = ops.cast(s < self.warmup, ms.float32)
        return is_warm * warm + (1.0 - is_warm) * cos


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    w = rng.normal(size=(16, 4)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.05 * rng.normal(size=(n, 4))).astype(np.float32)
    return x, y


def build(total_steps, seed=1, loss_scale=None, layer_norms=False):
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
    opt = nn.Momentum(net.trainable_params(), learning_rate=WarmupCosine(total_steps), momentum=0.9)
    with_loss = nn.WithLossCell(net, nn.MSELoss())
    if loss_scale is None:
        cell = TrainOneStepWithGradNorm(with_loss, opt, layer_norms=layer_norms)
    else:
        cell = TrainOneStepWithLossScaleGradNorm(with_loss, opt, scale_sense=loss_scale)
    return net, cell


class Slow(Callback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_train_step_end(self, run_context):
        time.sleep(self.seconds)


def train(hub, archive_dir, epochs=3, batch=8, extra_callbacks=(), loss_scale=None, layer_norms=False,
          **cb_kwargs):
    x, y = data()
    steps = epochs * (len(x) // batch)
    net, cell = build(steps, loss_scale=loss_scale, layer_norms=layer_norms)
    initial = [p.asnumpy().copy() for p in net.trainable_params()]
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch)
    cb = StepStreamCallback(hub=hub, project="mindspore", name="mlp", archive_dir=archive_dir,
                            system_metrics=False, config={"peak_lr": PEAK, "warmup": WARMUP}, **cb_kwargs)
    Model(cell).train(epochs, dataset, callbacks=[cb, *extra_callbacks], dataset_sink_mode=False)
    return cb.run, steps, initial, (x, y)


if __name__ == "__main__":
    hub, archive, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    run, *_ = train(hub, archive, epochs=epochs, extra_callbacks=[Slow(0.05)])
    print("done", flush=True)
