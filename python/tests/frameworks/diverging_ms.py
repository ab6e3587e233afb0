"""A tiny MindSpore regression (graph mode, CPU) that trains well for 60 steps, then diverges
(its learning rate jumps past stability), planned for 20,000 steps of 20 ms: a rule is to
stop it. python diverging_ms.py HUB OUT. Prints one JSON line when training ends: the run
id, the steps trained, the checkpoints saved and when it ended."""

import glob
import json
import os
import sys
import time

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindspore import Model, nn
from mindspore.train import Callback, CheckpointConfig, ModelCheckpoint

from stepstream.mindspore import StepStreamCallback

hub, out = sys.argv[1], sys.argv[2]
ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(0)
STEPS, GOOD = 20_000, 60
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype(np.float32)
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
net = nn.Dense(4, 1)
# Per step: a stable rate, then one well past what this problem takes.
lr = [0.05] * GOOD + [0.9] * (STEPS - GOOD)
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=lr))
ckpt = os.path.join(out, "ckpt")
saver = ModelCheckpoint(prefix="diverging", directory=ckpt, config=CheckpointConfig(save_checkpoint_steps=1_000_000))
cb = StepStreamCallback(hub=hub, project="rules", name="diverging", archive_dir=out, system_metrics=False,
                        console=False, config={"max_steps": STEPS})
steps = {"n": 0}


class Slow(Callback):
    def on_train_step_end(self, run_context):
        steps["n"] += 1
        if steps["n"] == 1:
            with open(os.path.join(out, "run_id"), "w") as f:
                f.write(cb.run.run_id)
        time.sleep(0.02)


model.train(STEPS // 8, dataset, callbacks=[cb, saver, Slow()], dataset_sink_mode=False)
files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckpt, "*.ckpt")))
print(json.dumps({"run_id": cb.run.run_id, "steps": steps["n"], "checkpoints": files, "ended_at": time.time()}))
