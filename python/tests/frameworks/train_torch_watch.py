"""A tiny PyTorch MLP watched by stepstream.torch.watch (per-layer norms and histograms every
5th backward pass) with a Histogram of its output every step. Prints one JSON line: the run
id, each watched step's per-layer grad and weight norms computed here, the host copies made,
and the output histogram of the last step computed by numpy."""

import json
import sys

import numpy as np
import torch

import stepstream
import stepstream.torch as sst
from stepstream import _tensors

hub, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
run = stepstream.init(hub=hub, project="frameworks", name="torch-watch", archive_dir=None,
                      system_metrics=False, framework="pytorch", defer_every=10, console=False)
watch = sst.watch(model, run, every=5, histograms=True, bins=16)
before = dict(_tensors.stats)
expected = {}
steps = 30
for step in range(steps):
    out_t = model(x)
    loss = torch.nn.functional.mse_loss(out_t, y)
    opt.zero_grad()
    loss.backward()
    if step == 0 or (step + 1) % 5 == 0:
        per = {}
        for layer in ("0", "2"):
            ps = [p for n, p in model.named_parameters() if n.startswith(layer + ".")]
            per[f"grad_norm/{layer}"] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ps)))
            per[f"weight_norm/{layer}"] = float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in ps)))
        expected[step] = per
    opt.step()
    # Without a step: `log` numbers it, and the watch's records must not shift it.
    run.log({"loss": loss, "output": stepstream.Histogram(out_t.detach(), bins=8)})
last_out = out_t.detach().numpy().reshape(-1)
counts, _ = np.histogram(last_out, bins=8, range=(float(last_out.min()), float(last_out.max())))
report = run.finish()
watch.remove()
copies = _tensors.stats["host_copies"] - before["host_copies"]
print(json.dumps({"run_id": run.run_id, "expected": expected, "copies": copies,
                  "last_counts": counts.tolist(), "last_range": [float(last_out.min()), float(last_out.max())],
                  "report": report}))
