"""`stepstream import` on event files written by tensorboardX (as PyTorch's SummaryWriter
and MindFormers write them), including MindFormers' tag names and its `... vs samples`
tags, which count samples, not steps."""

import subprocess

import numpy as np
import pytest

from tensorboardX import SummaryWriter

from conftest import binary

MINDFORMERS_TAGS = ["loss", "learning-rate", "grad-norm", "loss-scale", "iteration-time", "throughput"]


def test_tensorboardx_and_mindformers_event_files(hub, tmp_path):
    logs = tmp_path / "tb"
    w = SummaryWriter(str(logs / "mindformers_rank_0"))
    for step in range(1, 21):
        for i, tag in enumerate(MINDFORMERS_TAGS):
            w.add_scalar(tag, step * 0.5 + i, global_step=step, walltime=1764700000.0 + step)
        w.add_scalar("loss vs samples", 1.0, global_step=step * 32)
    w.close()
    w = SummaryWriter(str(logs / "torch_run"))
    rng = np.random.default_rng(0)
    weights = rng.normal(size=1000)
    picture = (np.arange(4 * 6 * 3) % 251).astype(np.uint8).reshape(4, 6, 3)
    for step in range(5):
        w.add_scalars("eval", {"acc": step / 10, "f1": step / 20}, global_step=step)
        w.add_scalar("train/loss", 2.0 - step / 10, global_step=step)
        w.add_text("generation", f"sample at {step}", global_step=step)
    w.add_histogram("weights", weights, global_step=4)
    w.add_image("picture", picture, global_step=4, dataformats="HWC")
    w.close()

    out = subprocess.run([binary(), "import", str(logs), "--hub", hub.url, "--project", "imported"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    runs = {r["name"]: r for r in hub.api("/api/runs")["runs"]}
    mf = runs["mindformers_rank_0"]
    assert mf["project"] == "imported" and mf["records"] == 20
    info = hub.run(mf["run_id"])
    assert sorted(info["metrics"]) == sorted(MINDFORMERS_TAGS), "no 'vs samples' tag"
    lr = hub.series(mf["run_id"], "learning-rate")
    assert sorted(lr) == list(range(1, 21)) and lr[4] == 3.0
    series = hub.api(f"/api/runs/{mf['run_id']}/series?metric=loss")
    assert series["times"][0] == 1764700001.0
    torch_run = runs["torch_run"]
    assert hub.series(torch_run["run_id"], "train/loss")[3] == 1.7000000476837158
    # add_scalars writes each series in a folder of its own: runs of their own too.
    assert any(name.startswith("torch_run/eval") for name in runs), sorted(runs)
    # Text, histogram and image summaries are the run's samples.
    gens = hub.api(f"/api/runs/{torch_run['run_id']}/samples?key=generation&from_step=0")["samples"]
    assert [(g["step"], g["body"]) for g in gens] == [(s, f"sample at {s}") for s in range(5)]
    hist = hub.api(f"/api/runs/{torch_run['run_id']}/samples?key=weights")["samples"][0]["body"]
    assert sum(hist["counts"]) == pytest.approx(1000) and len(hist["counts"]) == 30
    assert hist["lo"] == pytest.approx(weights.min()) and hist["hi"] == pytest.approx(weights.max())
    img = hub.api(f"/api/runs/{torch_run['run_id']}/samples?key=picture")["samples"][0]["body"]
    assert (img["width"], img["height"], img["format"]) == (6, 4, "image/png")
    assert "summaries stored" in out.stderr, out.stderr
    # Again, nothing new: nothing doubled.
    out = subprocess.run([binary(), "import", str(logs), "--hub", hub.url, "--project", "imported"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert hub.run(mf["run_id"])["records"] == 20
