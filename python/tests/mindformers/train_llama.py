"""A real MindFormers training on CPU: a tiny LLaMA through mindformers' own Trainer, with
its own loss monitor (what `tail --format mindformers` reads), its own TensorBoard writer
(what `import` reads) and, when asked, stepstream's MindSpore callback beside them.

    python train_llama.py OUT [--steps 100] [--epochs 1] [--sink-size 1] [--stepstream]

MindFormers writes its file log under OUT/output/log/rank_0/info.log; the console (what
`python train_llama.py > train.log` keeps) is this process's stdout/stderr. Run as a file:
MindSpore compiles graphs from source files (a script given with `python -c` fails).

Three work-arounds make MindFormers 1.9 train on CPU (its own code assumes Ascend):
- MindSpore's `TrainOneStepWithLossScaleCell.get_overflow_status` asks `NPUGetFloatStatusV2`
  on CPU; the infnan path it uses on GPU works on CPU too;
- `build_context` in GRAPH_MODE on CPU before the Trainer, which otherwise switches to
  PyNative;
- TensorBoard through the trainer's config.
"""

import argparse
import os
import sys

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--sink-size", type=int, default=1)
parser.add_argument("--stepstream", action="store_true", help="add stepstream's callback")
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

out = os.path.abspath(args.out)
os.makedirs(out, exist_ok=True)
os.chdir(out)

import mindspore as ms  # noqa: E402
from mindspore import ops  # noqa: E402
from mindspore.nn.wrap import loss_scale as _ls  # noqa: E402

# CPU has neither NPUGetFloatStatusV2 nor FloatStatus: a gradient overflowed when it is not
# all finite.
_not_finite = ops.MultitypeFuncGraph("_not_finite")


@_not_finite.register("Tensor")
def _not_finite_tensor(g):
    return ops.reshape(ops.cast(ops.logical_not(ops.isfinite(g).all()), ms.float32), (1,))


def _overflow_on_cpu(self, status, compute_output):
    return self._get_distributed_overflow_status_on_infnan_mode(_not_finite, compute_output)


_ls.TrainOneStepWithLossScaleCell.get_overflow_status = _overflow_on_cpu

import mindformers  # noqa: E402
from mindformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402
from mindformers.tools.register import MindFormerConfig  # noqa: E402

mindformers.build_context({"context": {"mode": "GRAPH_MODE", "device_target": "CPU"}})

SEQ = 32
VOCAB = 128
BATCH = 2


def samples():
    rng = np.random.default_rng(0)
    # A learnable stream: each sequence counts up from a random start, mod the vocabulary.
    for _ in range(args.steps * BATCH):
        start = int(rng.integers(0, VOCAB))
        yield (np.arange(start, start + SEQ + 1, dtype=np.int32) % VOCAB,)


dataset = ms.dataset.GeneratorDataset(samples, column_names=["input_ids"], shuffle=False)
dataset = dataset.batch(BATCH, drop_remainder=True)

config = LlamaConfig(
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    vocab_size=VOCAB,
    seq_length=SEQ,
    batch_size=BATCH,
    use_rope_slice=True,
    compute_dtype="float32",
    layernorm_compute_type="float32",
    softmax_compute_type="float32",
    rotary_dtype="float32",
    param_init_type="float32",
    use_flash_attention=False,
    use_past=False,
    fused_rms_norm=False,  # no RmsNorm kernel on CPU
)
model = LlamaForCausalLM(config)

training = TrainingArguments(
    output_dir=os.path.join(out, "output"),
    use_cpu=True,
    device_target="CPU",
    num_train_epochs=args.epochs,
    per_device_train_batch_size=BATCH,
    learning_rate=args.lr,
    lr_scheduler_type="constant_with_warmup",
    warmup_steps=10,
    sink_mode=args.sink_size > 1,
    sink_size=args.sink_size,
    save_strategy="no",
    logging_strategy="steps",
    logging_steps=1,
    seed=0,
)

callbacks = []
if args.stepstream:
    from stepstream.mindspore import StepStreamCallback

    # A stop or checkpoint command from the hub saves here (MindFormers' own saving is off).
    callbacks.append(StepStreamCallback(project="mindformers", name=os.environ.get("RUN_NAME", "tiny-llama"),
                                        run_id=os.environ.get("RUN_ID"),
                                        checkpoint_dir=os.environ.get("STEPSTREAM_CKPT") or None))

trainer = Trainer(args=training, task="text_generation", model=model, train_dataset=dataset,
                  callbacks=callbacks)
trainer.config.tensorboard = MindFormerConfig(tensorboard_dir=os.path.join(out, "tensorboard"))
trainer.train()
print("TRAINED", flush=True)
sys.stdout.flush()
