"""Every integration with its real framework on CPU, each training in its own process (as a
user's script would), streaming to a real hub: every step arrives, the lr is the one the
optimizer applied at that step, evaluation metrics land at their steps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "frameworks"


def train(script: str, hub, tmp_path, env=None) -> dict:
    proc = subprocess.run(
        [sys.executable, str(HERE / script), hub.url, str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pytorch_plain_loop(hub, tmp_path):
    r = train("train_torch.py", hub, tmp_path)
    assert r["delivered"]
    norms, lrs = hub.series(r["run_id"], "grad_norm"), hub.series(r["run_id"], "lr")
    assert sorted(norms) == list(range(30)) and sorted(lrs) == list(range(30))
    for step in range(30):
        assert norms[step] == pytest.approx(r["norm"][step], rel=1e-5), f"grad norm at {step}"
        assert lrs[step] == pytest.approx(r["lr"][step], rel=1e-9), f"lr at {step}"
    assert len(hub.series(r["run_id"], "loss")) == 30
    # 60 tensors (loss, grad norm) crossed to the host in one copy per 10 steps, not per tensor.
    assert r["tensors"] == 60 and r["copies"] <= 3, r
    assert hub.run(r["run_id"])["framework"] == "pytorch"


def test_transformers_trainer(hub, tmp_path):
    r = train("train_hf.py", hub, tmp_path)
    info = hub.run(r["run_id"])
    assert info["status"] == "finished" and info["framework"] == "transformers"
    assert info["config"]["training_args"]["max_steps"] == 12
    assert info["config"]["model_config"]["n_embd"] == 16
    lrs = hub.series(r["run_id"], "learning_rate")
    assert sorted(lrs) == list(range(1, 13)), "every optimizer step"
    for step in range(1, 13):
        assert lrs[step] == pytest.approx(r["lr"][step - 1], rel=1e-6), f"applied lr at step {step}"
    assert sorted(hub.series(r["run_id"], "loss")) == [2, 4, 6, 8, 10, 12]
    assert sorted(hub.series(r["run_id"], "grad_norm")) == [2, 4, 6, 8, 10, 12]
    assert sorted(hub.series(r["run_id"], "eval_loss")) == [6, 12]
    tokens = hub.series(r["run_id"], "tokens_seen")
    assert tokens[12] == 12 * 4 * 16, tokens
    assert len(hub.series(r["run_id"], "tokens_per_sec")) == 11
    # `watch=4`: every layer's norms at the first backward pass and every 4th.
    info = hub.run(r["run_id"])
    layers = [m for m in info["metrics"] if m.startswith("grad_norm/")]
    assert "grad_norm/transformer.h.0.attn.c_attn" in layers and len(layers) > 5, layers
    assert len(hub.series(r["run_id"], "grad_norm/transformer.h.0.attn.c_attn")) == 4
    assert len(hub.series(r["run_id"], "weight_norm/transformer.wte")) == 4
    # A Text logged through the Trainer reaches the run, at its step.
    gens = hub.api(f"/api/runs/{r['run_id']}/samples?key=generation&from_step=0")["samples"]
    assert [(g["step"], g["body"]) for g in gens] == [(6, "generated at step 6"), (12, "generated at step 12")]


def test_lightning_logger_beside_another(hub, tmp_path):
    r = train("train_lightning.py", hub, tmp_path)
    info = hub.run(r["run_id"])
    assert info["status"] == "finished" and info["config"]["hidden"] == 8
    ours = hub.series(r["run_id"], "train_loss")
    csv_rows = {int(k): v for k, v in r["csv"].items()}
    assert ours.keys() == csv_rows.keys() and len(ours) == 16
    for step, v in csv_rows.items():
        assert ours[step] == pytest.approx(v, rel=1e-6)
    assert len(hub.series(r["run_id"], "val_loss")) == 2
    gens = hub.api(f"/api/runs/{r['run_id']}/samples?key=generation&from_step=0")["samples"]
    # (The sanity check's validation may add one at step 0.)
    assert [(g["step"], g["body"]) for g in gens if g["step"] > 0] == [(8, "epoch 0"), (16, "epoch 1")], gens


def assert_fit_of_eight_steps(hub, r, lr_metric, eval_metric):
    """A `fit` of 8 steps (2 epochs of 4): finished, the lr the optimizer applied at every
    step, every step's loss, the evaluation at the end of each epoch."""
    assert hub.run(r["run_id"])["status"] == "finished" and r["steps"] == 8
    lrs = hub.series(r["run_id"], lr_metric)
    assert sorted(lrs) == list(range(8))
    for step in range(8):
        assert lrs[step] == pytest.approx(r["lr"][step], rel=1e-6), f"applied lr at {step}"
    assert len(hub.series(r["run_id"], "loss")) == 8
    assert sorted(hub.series(r["run_id"], eval_metric)) == [3, 7]


def test_paddle_model_fit(hub, tmp_path):
    r = train("train_paddle.py", hub, tmp_path)
    assert_fit_of_eight_steps(hub, r, "lr", "eval_acc")


def test_keras_fit(hub, tmp_path):
    r = train("train_keras.py", hub, tmp_path, env={"KERAS_BACKEND": "torch"})
    assert_fit_of_eight_steps(hub, r, "learning_rate", "val_loss")


def test_pytorch_watch_logs_per_layer_norms_and_histograms_without_a_sync_per_step(hub, tmp_path):
    r = train("train_torch_watch.py", hub, tmp_path)
    assert r["report"]["delivered"], r
    run_id = r["run_id"]
    # Every watched step (the first backward and every 5th), each layer's norms as computed
    # by hand, at the step being trained.
    for name in ("grad_norm/0", "grad_norm/2", "weight_norm/0", "weight_norm/2"):
        got = hub.series(run_id, name)
        want = {int(s): v[name] for s, v in r["expected"].items()}
        assert sorted(got) == sorted(want), (name, sorted(got))
        for s, v in want.items():
            assert got[s] == pytest.approx(v, rel=1e-5), (name, s)
    # `log` without a step kept its numbering: loss at 0..29.
    assert sorted(hub.series(run_id, "loss")) == list(range(30))
    # The output's histogram each step, the last one equal to numpy's (same bins).
    out = hub.api(f"/api/runs/{run_id}/samples?key=output&from_step=0")["samples"]
    assert [s["step"] for s in out] == list(range(30))
    last = out[-1]["body"]
    assert last["counts"] == r["last_counts"]
    assert [last["lo"], last["hi"]] == pytest.approx(r["last_range"], rel=1e-6)
    grads = hub.api(f"/api/runs/{run_id}/samples?key=grad/0&from_step=0")["samples"]
    assert [s["step"] for s in grads] == [0, 4, 9, 14, 19, 24, 29]
    assert sum(grads[0]["body"]["counts"]) == 8 * 16 + 16  # every weight and bias of layer 0
    # 30 steps, 88 tensors and 58 histograms: host copies per batch (every 10 records, and
    # every 11 histograms, one copy per device and histogram size), not per step or tensor.
    assert r["copies"] <= 16, r["copies"]
