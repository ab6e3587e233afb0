"""A tiny training of one framework that would run for minutes, to be stopped from outside
(the page, the API, ``stepstream stop``): python stoppable.py FRAMEWORK HUB OUT.

Each step sleeps 20 ms (a training step's worth of time). As soon as its run exists the
script writes the run id to OUT/run_id; when the training ends it prints one JSON line: the
run id, the steps it trained, the checkpoint files in OUT/ckpt and when it stopped.
"""

import glob
import json
import os
import sys
import time

framework, hub, out = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ.setdefault("KERAS_BACKEND", "torch")
ckpt = os.path.join(out, "ckpt")
common = dict(hub=hub, project="commands", archive_dir=out, system_metrics=False, console=False)
STEP_S = 0.02
MANY = 20_000  # steps: ~7 minutes unless stopped
state = {"steps": 0}


def started(run):
    if run is not None and not os.path.exists(os.path.join(out, "run_id")):
        with open(os.path.join(out, "run_id.tmp"), "w") as f:
            f.write(run.run_id)
        os.replace(os.path.join(out, "run_id.tmp"), os.path.join(out, "run_id"))


def tick(run):
    state["steps"] += 1
    started(run)
    time.sleep(STEP_S)


if framework == "torch":
    import torch

    import stepstream

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    run = stepstream.init(name="torch-stoppable", framework="pytorch", **common)

    def save(cmd):
        # A checkpoint on command (and before a stop that wants one): the path is the answer.
        if cmd.action == "checkpoint" or (cmd.action == "stop" and cmd.checkpoint):
            os.makedirs(ckpt, exist_ok=True)
            path = os.path.join(ckpt, f"step{state['steps']}.pt")
            torch.save(model.state_dict(), path)
            return path

    run.on_command(save)
    for step in range(MANY):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss}, step=step)
        if run.should_stop:
            break
        tick(run)
    run.finish()

elif framework == "hf":
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from stepstream.transformers import StepStreamCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)]
    args = TrainingArguments(output_dir=ckpt, max_steps=MANY, per_device_train_batch_size=4, save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=10, run_name="hf-stoppable")
    cb = StepStreamCallback(**common)

    class Slow(TrainerCallback):
        def on_step_end(self, args, st, control, **kw):
            tick(cb.run)

    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb, Slow()]).train()

elif framework == "lightning":
    import lightning as L
    import torch

    from stepstream.lightning import StepStreamCommands, StepStreamLogger

    torch.manual_seed(0)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=True)
            tick(logger._lazy.run)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    logger = StepStreamLogger(name="lightning-stoppable", **common)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(max_steps=MANY, logger=logger, callbacks=[StepStreamCommands(logger, dirpath=ckpt)],
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                        enable_checkpointing=False, accelerator="cpu", default_root_dir=out)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(ds, batch_size=8))

elif framework == "keras":
    import keras
    import numpy as np

    from stepstream.keras import StepStreamCallback

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    cb = StepStreamCallback(checkpoint_dir=ckpt, name="keras-stoppable", **common)

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            tick(cb.run)

    model.fit(x, y, epochs=MANY // 8, batch_size=8, callbacks=[cb, Slow()], verbose=0)

elif framework == "paddle":
    import numpy as np
    import paddle

    from stepstream.paddle import StepStreamCallback

    paddle.seed(0)
    paddle.set_device("cpu")

    class Data(paddle.io.Dataset):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.x = rng.standard_normal((64, 4)).astype("float32")
            self.y = self.x.sum(1, keepdims=True).astype("float32")

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return 64

    net = paddle.nn.Linear(4, 1)
    model = paddle.Model(net)
    model.prepare(paddle.optimizer.SGD(learning_rate=0.01, parameters=net.parameters()), paddle.nn.MSELoss())
    cb = StepStreamCallback(checkpoint_dir=ckpt, name="paddle-stoppable", **common)

    class Slow(paddle.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            tick(cb.run)

    model.fit(Data(), epochs=MANY // 8, batch_size=8, callbacks=[cb, Slow()], verbose=0)

elif framework == "mindspore":
    import mindspore as ms
    import mindspore.dataset as mds
    import numpy as np
    from mindspore import Model, nn
    from mindspore.train import Callback, CheckpointConfig, ModelCheckpoint

    from stepstream.mindspore import StepStreamCallback

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = x.sum(1, keepdims=True).astype(np.float32)
    dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
    net = nn.Dense(4, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    cb = StepStreamCallback(name="mindspore-stoppable", **common)
    # A ModelCheckpoint that would save rarely: a stop or checkpoint command saves into its folder.
    saver = ModelCheckpoint(prefix="tiny", directory=ckpt, config=CheckpointConfig(save_checkpoint_steps=1_000_000))

    class Slow(Callback):
        def on_train_step_end(self, run_context):
            tick(cb.run)

    model.train(MANY // 8, dataset, callbacks=[cb, saver, Slow()], dataset_sink_mode=False)

else:
    raise SystemExit(f"unknown framework {framework}")

files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckpt, "*")))
print(json.dumps({"framework": framework, "steps": state["steps"], "checkpoints": files, "ended_at": time.time()}))
