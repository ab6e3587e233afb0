"""Real MindFormers (1.9.0, MindSpore 2.9.0, on CPU), not format strings: a tiny LLaMA trains
through mindformers' own Trainer (``train_llama.py``), and what stepstream stores is checked
against what MindFormers itself wrote: its loss monitor's lines in the console and in its file
log, and its TensorBoard event files.

Runs in its own venv (``.venv-mindformers``, made by ``scripts/python-wheel``): MindFormers
1.9 needs MindSpore 2.9, the main venv has 2.10.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import binary

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_llama.py"

MONITOR = re.compile(
    r"\{ Epoch:\[\s*(\d+)/\s*\d+\], step:\[\s*(\d+)/\s*(\d+)\], "
    r"loss:(?:\[([-\d.naif]+)/[-\d.naif]+\]| ([-\d.naif]+)),.*?lr: ([^,]+), overflow cond: (\w+), "
    r"loss_scale: ([\d.]+), global_norm: \[([^\]]+)\]"
)


def monitor_lines(text):
    """Every loss-monitor line MindFormers printed, in order, read here with a regular
    expression of the test's own (not stepstream's parser): (epoch, step, steps per epoch,
    values)."""
    out = []
    for m in MONITOR.finditer(text):
        epoch, step, per_epoch = int(m[1]), int(m[2]), int(m[3])
        out.append((epoch, step, per_epoch, {
            "loss": float(m[4] or m[5]),
            "lr": float(m[6]),
            "overflow": 1.0 if m[7] == "True" else 0.0,
            "loss_scale": float(m[8]),
            "global_norm": float(m[9]),
        }))
    return out


def train(out: Path, hub, *args, run_id=None, stepstream=False):
    """Starts a training whose console (stdout and stderr, as `python run.py > train.log 2>&1`
    keeps it) goes to ``out/console.log``."""
    out.mkdir(parents=True, exist_ok=True)
    console = open(out / "console.log", "wb")
    env = {**os.environ, "STEPSTREAM_HUB": hub.url, "RUN_ID": run_id or ""}
    cmd = [sys.executable, str(TRAIN), str(out), *args] + (["--stepstream"] if stepstream else [])
    return subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, env=env)


def finish_training(proc, out: Path, timeout=300):
    assert proc.wait(timeout=timeout) == 0, (out / "console.log").read_text()[-4000:]
    text = (out / "console.log").read_text()
    assert "TRAINED" in text
    return text


def tail(hub, path: Path, run_id: str, follow: bool):
    args = [binary(), "tail", str(path), "--format", "mindformers", "--hub", hub.url,
            "--run-id", run_id, "--project", "mindformers", "--poll-ms", "100"]
    if not follow:
        args.append("--no-follow")
    return subprocess.Popen(args, stderr=subprocess.PIPE, text=True)


def stopped(proc, sig=signal.SIGINT):
    if sig is not None:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def close(a, b, rel=1e-6, abs_=0.0):
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_)


def assert_series(hub, run_id, metric, expected, abs_=0.0, rel=1e-6):
    """The hub holds exactly ``expected`` ({step: value}) for ``metric``."""
    got = hub.series(run_id, metric)
    assert sorted(got) == sorted(expected), f"{metric}: steps {sorted(got)} != {sorted(expected)}"
    bad = [(s, got[s], v) for s, v in expected.items() if not close(got[s], v, rel, abs_)]
    assert not bad, f"{metric}: (step, stored, printed) differ: {bad[:5]}"


def global_steps(lines):
    # MindFormers' own global step: the epoch's step plus the epochs before.
    return [step + (epoch - 1) * per_epoch for epoch, step, per_epoch, _ in lines]


@pytest.fixture(scope="module")
def hub_module(tmp_path_factory):
    from conftest import Hub, free_port
    hub = Hub(tmp_path_factory.mktemp("hub"), free_port()).start()
    yield hub
    hub.stop()


def test_callback_tail_of_both_log_shapes_and_import_against_what_mindformers_wrote(hub_module, tmp_path):
    hub = hub_module
    out = tmp_path / "run"
    proc = train(out, hub, "--steps", "20", "--epochs", "2", run_id="mf-callback", stepstream=True)
    console = out / "console.log"
    info = out / "output" / "log" / "rank_0" / "info.log"
    # Both logs followed while they grow: the console from the start, the file log once
    # MindFormers has made it.
    following = {"console": tail(hub, console, "mf-tail-console", follow=True)}
    deadline = time.time() + 120
    while not info.exists():
        assert proc.poll() is None or info.exists(), "training ended without its file log"
        assert time.time() < deadline, "no file log"
        time.sleep(0.1)
    following["info"] = tail(hub, info, "mf-tail-info", follow=True)
    text = finish_training(proc, out)
    lines = monitor_lines(text)
    steps = global_steps(lines)
    assert steps == list(range(1, 41)), steps
    expected = {name: {s: v[name] for s, (_, _, _, v) in zip(steps, lines)}
                for name in ("loss", "lr", "overflow", "loss_scale", "global_norm")}

    # Our callback in Trainer(callbacks=[...]): every step's values equal what the loss monitor
    # printed (loss printed with 6 decimals; lr and the norm as float32 reprs).
    hub.wait("the callback's run to finish", lambda: hub.run("mf-callback")["status"] == "finished")
    assert_series(hub, "mf-callback", "loss", expected["loss"], abs_=5.1e-7)
    assert_series(hub, "mf-callback", "lr", expected["lr"])
    assert_series(hub, "mf-callback", "grad_norm", expected["global_norm"])
    assert_series(hub, "mf-callback", "loss_scale", expected["loss_scale"], rel=0)
    assert_series(hub, "mf-callback", "overflow", expected["overflow"], rel=0)

    # Both tails, still following after the run ended, hold every step (the last one too),
    # then stop cleanly on Ctrl-C and say what the hub stored.
    for name, run_id in [("console", "mf-tail-console"), ("info", "mf-tail-info")]:
        hub.wait(f"the {name} tail's last step", lambda: hub.run(run_id)["last_step"] == 40)
        code, err = stopped(following[name])
        assert code == 0, err
        assert "loss: 40 of 40 values stored" in err, err
        assert "the hub stored all" in err, err
        assert_series(hub, run_id, "loss", expected["loss"], rel=0)
        assert_series(hub, run_id, "lr", expected["lr"], rel=0)
        assert_series(hub, run_id, "global_norm", expected["global_norm"], rel=0)
        assert_series(hub, run_id, "loss_scale", expected["loss_scale"], rel=0)
        assert hub.run(run_id)["records"] == 40
        # Every line of the log is the run's console, in order, each at its record's step.
        path = console if name == "console" else info
        got = hub.api(f"/api/runs/{run_id}/console?from_step=0&limit=100000")["lines"]
        assert [l["text"] for l in got] == path.read_text(errors="replace").splitlines()
        assert f"of {len(got)} log lines stored" in err, err
        at = {l["text"]: l["step"] for l in got}
        first = next(l for l in at if "step:[" in l and "loss:" in l)
        assert at[first] == 1, (first, at[first])

    # MindSpore's own (C++) log lines reach our callback's run through its console capture.
    printed = console.read_text(errors="replace").splitlines()
    native = [l for l in printed if l.startswith("[WARNING] ") or l.startswith("[ERROR] ")]
    captured = {l["text"] for l in hub.api("/api/runs/mf-callback/console?from_step=0&limit=100000")["lines"]}
    late = [l for l in native if l in captured]
    assert late, ("no MindSpore C++ line in the callback's console", native[:5], sorted(captured)[:5])

    # A tail of the finished file log (not following) and its repeat, which sends nothing twice.
    for attempt in range(2):
        code, err = stopped(tail(hub, info, "mf-tail-after", follow=False), sig=None)
        assert code == 0, err
    assert_series(hub, "mf-tail-after", "loss", expected["loss"], rel=0)
    assert hub.run("mf-tail-after")["records"] == 40

    # `import` on its TensorBoard directory: the loss MindFormers wrote there, every step.
    imported = subprocess.run([binary(), "import", str(out / "tensorboard"), "--hub", hub.url,
                               "--project", "mindformers-tb"], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert "values stored" in imported.stderr and "NOT" not in imported.stderr, imported.stderr
    runs = [r for r in hub.api("/api/runs")["runs"] if r["project"] == "mindformers-tb"]
    assert len(runs) == 1, runs
    assert_series(hub, runs[0]["run_id"], "loss", expected["loss"], abs_=5.1e-7)
    assert_series(hub, runs[0]["run_id"], "grad-norm", expected["global_norm"])


def test_sink_mode_callback_and_tail(hub_module, tmp_path):
    """``sink_size > 1``: on CPU MindSpore runs every step of a sink (MindFormers turns the
    epochs into sinks and trains sink_size times the steps: its own behaviour), and the loss
    monitor restarts its step count in every sink, so its printed global step repeats. The
    callback records MindSpore's true step; the tail stores every line as printed."""
    hub = hub_module
    out = tmp_path / "sink"
    proc = train(out, hub, "--steps", "8", "--epochs", "1", "--sink-size", "4",
                 run_id="mf-sink", stepstream=True)
    text = finish_training(proc, out)
    lines = monitor_lines(text)
    assert len(lines) >= 8, len(lines)
    printed_loss = [v["loss"] for *_, v in lines]
    hub.wait("the callback's run to finish", lambda: hub.run("mf-sink")["status"] == "finished")
    loss = hub.series("mf-sink", "loss")
    assert sorted(loss) == list(range(1, len(lines) + 1)), sorted(loss)
    bad = [(s, loss[s], p) for s, p in zip(sorted(loss), printed_loss) if abs(loss[s] - p) > 5.1e-7]
    assert not bad, bad
    code, err = stopped(tail(hub, out / "output" / "log" / "rank_0" / "info.log", "mf-sink-tail",
                             follow=False), sig=None)
    assert code == 0, err
    assert f"loss: {len(lines)} of {len(lines)} values stored" in err, err


def test_a_mindformers_training_is_stopped_through_the_callback_with_a_checkpoint_first(hub_module, tmp_path):
    """`stepstream stop` on a real MindFormers Trainer: the callback saves the train network
    and asks MindSpore to stop at the step's end; the run ends `stopped`."""
    hub = hub_module
    out = tmp_path / "run"
    ckpt = tmp_path / "ckpt"
    os.environ["STEPSTREAM_CKPT"] = str(ckpt)
    try:
        proc = train(out, hub, "--steps", "3000", run_id="mf-stop", stepstream=True)
    finally:
        del os.environ["STEPSTREAM_CKPT"]
    hub.wait("the training to stream", lambda: (hub.run("mf-stop").get("last_step") or 0) >= 5, timeout=300)
    cli = subprocess.run([binary(), "stop", "mf-stop", "--hub", hub.url, "--by", "tester", "--wait", "120"],
                         capture_output=True, text=True, timeout=180)
    assert cli.returncode == 0, cli.stderr + cli.stdout
    assert "stop honoured at step" in cli.stdout and "run mf-stop ended: stopped" in cli.stdout, cli.stdout
    finish_training(proc, out)
    info = hub.run("mf-stop")
    assert info["status"] == "stopped" and info["last_step"] < 3000, info
    saved = list(ckpt.glob("*.ckpt"))
    assert saved, list(tmp_path.iterdir())
    (cmd,) = hub.api("/api/runs/mf-stop/commands")["commands"]
    assert cmd["state"] == "honoured" and saved[0].name in cmd["message"], cmd
