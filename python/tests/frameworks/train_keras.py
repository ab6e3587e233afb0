"""A tiny Keras 3 model (torch backend) trained by fit() with the callback and an
exponential-decay schedule. Prints one JSON line: the run id and the applied lr per step."""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from stepstream.keras import StepStreamCallback  # noqa: E402

hub, out = sys.argv[1], sys.argv[2]
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
y = x.sum(1, keepdims=True)
schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.8)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule), loss="mse", metrics=["mae"])
cb = StepStreamCallback(hub=hub, project="frameworks", name="keras-fit", archive_dir=out, system_metrics=False)
model.fit(x, y, epochs=2, batch_size=16, validation_data=(x[:16], y[:16]), callbacks=[cb], verbose=0)
lrs = [float(keras.ops.convert_to_numpy(schedule(i))) for i in range(cb.global_step)]
print(json.dumps({"run_id": cb.run.run_id, "lr": lrs, "steps": cb.global_step}))
