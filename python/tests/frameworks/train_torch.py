"""A tiny PyTorch MLP in a plain loop, streaming loss, grad norm and the applied lr.
Prints one JSON line: the run id and, per step, the grad norm clip_grad_norm_ computed and
the lr the scheduler applied."""

import json
import sys

import torch

import stepstream
import stepstream.torch as sst
from stepstream import _tensors

hub, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
warm = 5
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warm) * 0.97 ** i)
x, y = torch.randn(64, 8), torch.randn(64, 1)
run = stepstream.init(hub=hub, project="frameworks", name="torch-loop", archive_dir=out,
                      system_metrics=False, framework="pytorch", defer_every=10)
expected_norm, expected_lr = [], []
before = dict(_tensors.stats)
steps = 30
for step in range(steps):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    norm = sst.grad_norm(model)
    lr = sst.lr(opt)
    # The reference: what clip_grad_norm_ computes (an infinite max leaves grads alone).
    expected_norm.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))))
    expected_lr.append(0.1 * min(1.0, (step + 1) / warm) * 0.97 ** step)
    opt.step()
    sched.step()
    run.log({"loss": loss, "grad_norm": norm, "lr": lr}, step=step)
report = run.finish()
copies = _tensors.stats["host_copies"] - before["host_copies"]
tensors = _tensors.stats["tensors"] - before["tensors"]
print(json.dumps({"run_id": run.run_id, "norm": expected_norm, "lr": expected_lr, "copies": copies,
                  "tensors": tensors, "delivered": report["delivered"]}))
