"""A tiny paddle.Model trained by fit() with the callback and a warmup + step-decay
schedule. Prints one JSON line: the run id and the lr the schedule applied at each step."""

import json
import sys

import numpy as np
import paddle

from stepstream.paddle import StepStreamCallback

hub, out = sys.argv[1], sys.argv[2]
paddle.seed(0)
paddle.set_device("cpu")


class Data(paddle.io.Dataset):
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 4)).astype("float32")
        self.y = (self.x.sum(1, keepdims=True) > 0).astype("int64")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def schedule():
    return paddle.optimizer.lr.LinearWarmup(paddle.optimizer.lr.StepDecay(0.1, step_size=4, gamma=0.5),
                                            warmup_steps=3, start_lr=0.01, end_lr=0.1)


net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))
model = paddle.Model(net, paddle.static.InputSpec([None, 4], "float32", "x"), paddle.static.InputSpec([None, 1], "int64", "y"))
model.prepare(paddle.optimizer.SGD(learning_rate=schedule(), parameters=net.parameters()),
              paddle.nn.CrossEntropyLoss(), paddle.metric.Accuracy())
cb = StepStreamCallback(hub=hub, project="frameworks", name="paddle-fit", archive_dir=out, system_metrics=False)
model.fit(Data(64), Data(16), epochs=2, batch_size=16, callbacks=[cb], verbose=0)
ref = schedule()
lrs = []
for _ in range(cb.global_step):
    lrs.append(ref())
    ref.step()
print(json.dumps({"run_id": cb.run.run_id, "lr": lrs, "steps": cb.global_step}))
