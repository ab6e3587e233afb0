"""A tiny LightningModule trained by Lightning's Trainer with StepStreamLogger beside a
CSVLogger. Prints one JSON line: the run id and the CSV logger's train_loss per step."""

import csv
import glob
import json
import os
import sys

import lightning as L
import torch

import stepstream
from lightning.pytorch.loggers import CSVLogger

from stepstream.lightning import StepStreamLogger

hub, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)


class Tiny(L.LightningModule):
    def __init__(self, lr=0.05, hidden=8):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self):
        # A generated sample straight to our logger, as a user would.
        self.loggers[0].log_metrics({"generation": stepstream.Text(f"epoch {self.current_epoch}")},
                                    step=self.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


x, y = torch.randn(64, 4), torch.randn(64, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
logger = StepStreamLogger(hub=hub, project="frameworks", name="lightning", archive_dir=out, system_metrics=False)
trainer = L.Trainer(max_epochs=2, logger=[logger, CSVLogger(out)], log_every_n_steps=1, accelerator="cpu",
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), loader, loader)
rows = []
for path in glob.glob(os.path.join(out, "lightning_logs", "*", "metrics.csv")):
    with open(path, newline="") as f:
        rows += [r for r in csv.DictReader(f) if r.get("train_loss")]
print(json.dumps({"run_id": logger.version, "csv": {int(r["step"]): float(r["train_loss"]) for r in rows}}))
