"""Real MindSpore 2.10 training on CPU streaming to a real hub."""

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")  # scripts/test installs it; a bare `pytest` run may not have it

import mstrain  # noqa: E402
from mindspore import ops  # noqa: E402


def numpy_grads(params, x, y):
    """The gradients of MSE(Dense-ReLU-Dense) at `params` on (x, y), by hand, in float64."""
    w1, b1, w2, b2 = params
    z = x @ w1.T + b1
    h = np.maximum(z, 0)
    o = h @ w2.T + b2
    d_o = 2 * (o - y) / o.size
    grads = [None] * 4
    grads[2] = d_o.T @ h
    grads[3] = d_o.sum(0)
    d_z = (d_o @ w2) * (z > 0)
    grads[0] = d_z.T @ x
    grads[1] = d_z.sum(0)
    return [g.astype(np.float64) for g in grads]


def numpy_grad_norm(params, x, y):
    """The global gradient norm of MSE(Dense-ReLU-Dense) at `params` on (x, y), by hand."""
    return float(np.sqrt(sum(float((g**2).sum()) for g in numpy_grads(params, x, y))))


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_step_lr_gradnorm_and_csv_match(hub, tmp_path):
    run, steps, initial, (x, y) = mstrain.train(hub.url, str(tmp_path))
    info = hub.wait("the run to finish", lambda: (r := hub.run(run.run_id))["status"] == "finished" and r)
    assert info["records"] == steps == 24
    assert info["config"]["peak_lr"] == mstrain.PEAK
    for name in ["loss", "lr", "grad_norm", "step_time", "samples_per_sec", "epoch", "batch_size", "data_wait"]:
        assert name in info["metrics"], name

    lr = hub.series(run.run_id, "lr")
    assert sorted(lr) == list(range(1, steps + 1)), "every step arrived"
    for step, value in lr.items():
        assert value == pytest.approx(mstrain.schedule(step - 1, steps), rel=1e-5), f"lr at step {step}"

    # Step 1's gradients are taken at the initial weights on the first batch.
    gnorm = hub.series(run.run_id, "grad_norm")
    assert gnorm[1] == pytest.approx(numpy_grad_norm(initial, x[:8], y[:8]), rel=1e-4)

    samples = hub.series(run.run_id, "batch_size")
    assert set(samples.values()) == {8.0}
    # The running total of samples: the x on which runs of other batch sizes compare.
    seen = hub.series(run.run_id, "samples_seen")
    assert seen == {step: 8.0 * step for step in range(1, steps + 1)}
    epochs = hub.series(run.run_id, "epoch")
    assert epochs[1] == 1 and epochs[24] == 3

    table = rows(run.metrics_csv)
    assert [int(r["step"]) for r in table] == list(range(1, steps + 1))
    loss = hub.series(run.run_id, "loss")
    for r in table:
        assert float(r["loss"]) == loss[int(r["step"])]
        assert float(r["lr"]) == lr[int(r["step"])]
    assert Path(run.config_path).read_text().startswith("{")


def test_sigkill_leaves_a_readable_csv_and_the_hub_judges_the_run(make_hub, tmp_path):
    hub = make_hub("--stale-after", "1", "--fail-after", "4")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "mstrain.py"), hub.url,
                             str(tmp_path), "50"], env=env)
    try:
        run_id = hub.wait("training under way", lambda: next(
            (r["run_id"] for r in hub.api("/api/runs")["runs"] if (r["last_step"] or 0) >= 40), None), timeout=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    hub.wait("stale", lambda: hub.run(run_id)["status"] == "stale", timeout=15)
    hub.wait("failed", lambda: hub.run(run_id)["status"] == "failed", timeout=15)
    assert "died" in hub.run(run_id)["status_message"]

    csvs = list(tmp_path.glob("run_*_metrics.csv"))
    assert len(csvs) == 1
    text = csvs[0].read_text()
    assert text.endswith("\n"), "no torn last line"
    table = list(csv.DictReader(text.splitlines()))
    steps = [int(r["step"]) for r in table]
    assert steps == list(range(1, len(steps) + 1)), "a contiguous prefix of the run"
    hub_last = hub.run(run_id)["last_step"]
    # At most the unflushed rows (10) and the one in flight are missing.
    assert len(steps) >= hub_last - 11, (len(steps), hub_last)
    loss = hub.series(run_id, "loss")
    for r in table:
        if int(r["step"]) in loss:
            assert float(r["loss"]) == loss[int(r["step"])]


def test_training_with_the_hub_down_then_up_ends_complete(make_hub, tmp_path):
    hub = make_hub(start=False)

    class StartHubMidway(mstrain.Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 10:
                hub.start()

    run, steps, *_ = mstrain.train(hub.url, str(tmp_path), extra_callbacks=[StartHubMidway()])
    info = hub.wait("every step", lambda: (r := hub.run(run.run_id))["records"] == steps and r, timeout=60)
    assert info["status"] == "finished"
    assert sorted(hub.series(run.run_id, "loss")) == list(range(1, steps + 1))


def test_loss_scale_cell_reports_scale_overflow_lr_and_unscaled_norm(hub, tmp_path):
    from mindspore import nn as msnn

    manager = msnn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**10, scale_factor=2, scale_window=4)
    run, steps, initial, (x, y) = mstrain.train(hub.url, str(tmp_path), loss_scale=manager, perplexity=True)
    hub.wait("the run to finish", lambda: hub.run(run.run_id)["status"] == "finished")
    scale = hub.series(run.run_id, "loss_scale")
    assert sorted(scale) == list(range(1, steps + 1))
    assert scale[1] == 1024.0 and max(scale.values()) > 1024.0, "the dynamic scale grows"
    assert set(hub.series(run.run_id, "overflow").values()) == {0.0}
    lr = hub.series(run.run_id, "lr")
    for step, value in lr.items():
        assert value == pytest.approx(mstrain.schedule(step - 1, steps), rel=1e-5), f"lr at step {step}"
    gnorm = hub.series(run.run_id, "grad_norm")
    assert gnorm[1] == pytest.approx(numpy_grad_norm(initial, x[:8], y[:8]), rel=1e-4)
    loss, ppl = hub.series(run.run_id, "loss"), hub.series(run.run_id, "perplexity")
    # exp on the device, in float32 (no host round trip per step).
    assert ppl[5] == pytest.approx(np.exp(loss[5]), rel=1e-6)


class _NotElementwise(mstrain.LearningRateSchedule):
    """Gives the right value for one step, and a wrong one per element for a vector: the
    callback must notice and read it step by step."""

    def __init__(self, total):
        super().__init__()
        self.inner = mstrain.WarmupCosine(total)

    def construct(self, global_step):
        return self.inner(ops.reduce_sum(global_step))


@pytest.mark.parametrize("schedule", ["elementwise", "not elementwise"])
def test_plain_model_lr_is_exact_at_every_step(hub, tmp_path, schedule):
    """`Model(net, loss, opt)`: no train cell returns the lr; the schedule is evaluated on a
    vector of future steps in one call (or, when it is not elementwise, per step)."""
    import mindspore.dataset as ds
    from mindspore import Model, nn

    x, y = mstrain.data()
    steps = 3 * (len(x) // 8)
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
    cls = mstrain.WarmupCosine if schedule == "elementwise" else _NotElementwise
    opt = nn.Momentum(net.trainable_params(), learning_rate=cls(steps), momentum=0.9)
    cb = mstrain.StepStreamCallback(hub=hub.url, project="mindspore", name=f"plain-{schedule}",
                                    archive_dir=str(tmp_path), system_metrics=False)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
    Model(net, nn.MSELoss(), opt).train(3, data, callbacks=[cb], dataset_sink_mode=False)
    assert cb._vector_ok is (schedule == "elementwise")
    lr = hub.series(cb.run.run_id, "lr")
    assert sorted(lr) == list(range(1, steps + 1))
    for step, value in lr.items():
        assert value == pytest.approx(mstrain.schedule(step - 1, steps), rel=1e-5), f"lr at step {step}"


def test_samples_callback_logs_text_and_a_weight_histogram_beside_the_steps(hub, tmp_path):
    import stepstream

    def samples(step, run_context):
        net = run_context.original_args().train_network
        weight = net.trainable_params()[0]
        return {"note": stepstream.Text(f"step {step}"), "weights": stepstream.Histogram(weight, bins=8)}

    run, steps, _initial, _data = mstrain.train(hub.url, str(tmp_path), samples=samples, samples_every=8)
    hub.wait("the run to finish", lambda: hub.run(run.run_id)["status"] == "finished")
    notes = hub.api(f"/api/runs/{run.run_id}/samples?key=note&from_step=0")["samples"]
    assert [(n["step"], n["body"]) for n in notes] == [(s, f"step {s}") for s in (1, 8, 16, 24)]
    hists = hub.api(f"/api/runs/{run.run_id}/samples?key=weights&from_step=0")["samples"]
    assert [h["step"] for h in hists] == [1, 8, 16, 24]
    weight_count = 32 * 16  # the first Dense layer's weight
    assert all(sum(h["body"]["counts"]) == weight_count for h in hists), hists[0]
    assert hub.run(run.run_id)["records"] == steps


def test_watch_logs_each_parameters_gradient_and_weight_norms_every_n_steps(hub, tmp_path):
    run, steps, initial, (x, y) = mstrain.train(hub.url, str(tmp_path), layer_norms=True, watch=4)
    info = hub.wait("the run to finish", lambda: (r := hub.run(run.run_id))["status"] == "finished" and r)
    # Dense layers 0 and 2 of the SequentialCell: a weight and a bias each.
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for family in ["grad_norm", "weight_norm"]:
        got = sorted(m for m in info["metrics"] if m.startswith(family + "/"))
        assert got == sorted(f"{family}/{n}" for n in names), got
    # At step 1 and every 4th step after, and only then.
    series = {n: hub.series(run.run_id, f"grad_norm/{n}") for n in names}
    assert sorted(series["0.weight"]) == [1] + list(range(4, steps + 1, 4))
    # Step 1's gradients are taken at the initial weights on the first batch: each layer's
    # norm is the norm of its own gradient.
    grads = numpy_grads(initial, x[:8], y[:8])
    for name, g in zip(names, grads):
        assert series[name][1] == pytest.approx(float(np.sqrt((g**2).sum())), rel=1e-4), name
    # The layers' norms make up the global one.
    total = np.sqrt(sum(series[n][1] ** 2 for n in names))
    assert hub.series(run.run_id, "grad_norm")[1] == pytest.approx(total, rel=1e-5)
    # Weight norms after step 1's update: positive, and the bias of a ReLU layer moved.
    weights = {n: hub.series(run.run_id, f"weight_norm/{n}") for n in names}
    assert all(weights[n][1] > 0 for n in ["0.weight", "2.weight"])
    assert weights["0.weight"][1] == pytest.approx(float(np.sqrt((initial[0].astype(np.float64) ** 2).sum())), rel=0.05)
