"""A tiny GPT-2 built from a config (no download), trained by transformers' Trainer with the
callback. Prints one JSON line: the run id and the lr the scheduler applied at each step."""

import json
import sys

import torch

import stepstream
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.optimization import get_linear_schedule_with_warmup

from stepstream.transformers import StepStreamCallback

hub, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(48)]
steps, warmup, base = 12, 3, 1e-3
args = TrainingArguments(
    output_dir=out, max_steps=steps, per_device_train_batch_size=4, learning_rate=base,
    lr_scheduler_type="linear", warmup_steps=warmup, logging_steps=2, eval_strategy="steps",
    eval_steps=6, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    include_num_input_tokens_seen=True, run_name="tiny-gpt2",
)
cb = StepStreamCallback(hub=hub, project="frameworks", archive_dir=out, system_metrics=False, watch=4)
class Generating(Trainer):
    """After each evaluation, a generated sample goes to the logs, as a user's would."""

    def evaluate(self, *a, **k):
        metrics = super().evaluate(*a, **k)
        self.log({"generation": stepstream.Text(f"generated at step {self.state.global_step}")})
        return metrics


Generating(model=model, args=args, train_dataset=data, eval_dataset=data[:8], callbacks=[cb]).train()
# The reference: the same schedule, stepped by hand.
opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
sched = get_linear_schedule_with_warmup(opt, warmup, steps)
lrs = []
for _ in range(steps):
    lrs.append(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
print(json.dumps({"run_id": cb.run.run_id, "lr": lrs}))
