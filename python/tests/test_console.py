"""The console and samples of real trainings: output from Python, from os.write and from C
(ctypes printf) with a tqdm progress bar, captured at the file-descriptor level while the
terminal still gets every byte; a run that raises; a SIGKILLed run; Text and Table samples,
and bad ones that warn while the run goes on."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import stepstream

SCRIPT = textwrap.dedent(
    """
    import ctypes, os, sys, time
    import torch
    from tqdm import tqdm
    import stepstream
    run = stepstream.init(hub=sys.argv[1], name="console", run_id=sys.argv[2], archive_dir=None,
                          system_metrics=False)
    libc = ctypes.CDLL(None)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for step in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        run.log({"loss": loss}, step=step)
        print(f"python print at step {step}", flush=True)
        os.write(1, f"os.write at step {step}\\n".encode())
        libc.printf(b"C printf at step %d\\n", ctypes.c_int(step))
        libc.fflush(None)
        print(f"warning on stderr at step {step}", file=sys.stderr, flush=True)
        # The rest of the step's work: a line takes the step current when its reader read
        # it, a fraction of a millisecond after it was printed.
        time.sleep(0.05)
    # A real tqdm bar: it redraws itself a hundred times on one line.
    for _ in tqdm(range(100), file=sys.stderr, mininterval=0, ascii=True, ncols=60, desc="epoch"):
        time.sleep(0.001)
    sys.stderr.flush()
    if sys.argv[3] == "raise":
        raise RuntimeError("diverged at step 4")
    if sys.argv[3] == "hang":
        print("about to be killed", flush=True)
        time.sleep(60)
    """
)


def start(hub, tmp_path, run_id, mode):
    script = tmp_path / "train_console.py"
    script.write_text(SCRIPT)
    # Bytes, not text: text mode would turn the progress bar's \r into line ends.
    return subprocess.Popen([sys.executable, str(script), hub.url, run_id, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def communicate(proc):
    out, err = proc.communicate(timeout=120)
    return out.decode(), err.decode()


def lines(hub, run_id, query="from_step=0&limit=100000"):
    return hub.api(f"/api/runs/{run_id}/console?{query}")["lines"]


def test_python_os_write_and_c_output_are_captured_and_the_terminal_sees_it_all(hub, tmp_path):
    proc = start(hub, tmp_path, "con-ok", "ok")
    out, err = communicate(proc)
    assert proc.returncode == 0, err
    # The terminal (here: the pipes) got everything, unchanged.
    for step in range(5):
        assert f"python print at step {step}\n" in out
        assert f"os.write at step {step}\n" in out
        assert f"C printf at step {step}\n" in out
        assert f"warning on stderr at step {step}\n" in err
    # The terminal got every redraw of the bar.
    assert err.count("\r") >= 100 and "100/100" in err
    got = lines(hub, "con-ok")
    stdout = [l["text"] for l in got if l["stream"] == "stdout"]
    stderr = [l["text"] for l in got if l["stream"] == "stderr"]
    want = []
    for step in range(5):
        want += [f"python print at step {step}", f"os.write at step {step}", f"C printf at step {step}"]
    assert stdout == want
    # The progress bar is its last state, one line; each line at its step.
    assert stderr[:5] == [f"warning on stderr at step {s}" for s in range(5)]
    assert len(stderr) == 6 and stderr[5].startswith("epoch: 100%|") and "100/100" in stderr[5], stderr
    steps = {l["text"]: l["step"] for l in got}
    assert steps["C printf at step 3"] == 3
    assert hub.run("con-ok")["status"] == "finished"


def test_a_run_that_raises_has_its_traceback_in_the_console_and_status(hub, tmp_path):
    proc = start(hub, tmp_path, "con-raise", "raise")
    _, err = communicate(proc)
    assert proc.returncode == 1
    assert "RuntimeError: diverged at step 4" in err
    info = hub.run("con-raise")
    assert info["status"] == "failed"
    assert info["status_message"].startswith("RuntimeError: diverged at step 4 (at train_console.py:")
    text = "\n".join(l["text"] for l in lines(hub, "con-raise") if l["stream"] == "stderr")
    assert "Traceback (most recent call last):" in text
    assert 'raise RuntimeError("diverged at step 4")' in text


def test_a_sigkilled_run_keeps_its_console_up_to_the_kill(hub, tmp_path):
    proc = start(hub, tmp_path, "con-kill", "hang")
    # Wait for the last line before the kill to be stored, then kill.
    hub.wait("the line before the kill", lambda: any(
        l["text"] == "about to be killed" for l in lines(hub, "con-kill")))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    texts = [l["text"] for l in lines(hub, "con-kill") if l["stream"] == "stdout"]
    assert texts[0] == "python print at step 0"
    assert "C printf at step 4" in texts and texts[-1] == "about to be killed"


def test_text_and_table_samples_and_bad_ones_warn_while_the_run_goes_on(hub):
    run = stepstream.init(hub=hub.url, name="samples", archive_dir=None, system_metrics=False,
                          console=False)
    table = stepstream.Table(columns=["prompt", "response", "reward"])
    table.add_row("2+2=", "4", 1.0)
    table.add_row("capital of France?", "Paris", float("nan"))
    for step in range(10):
        run.log({"loss": 1.0 / (step + 1), "generation": stepstream.Text(f"sample {step}")}, step=step)
    run.log({"rollouts": table}, step=9)
    # Bad samples: a huge text (not copied), a ragged table; scalars beside them still go.
    huge = "x" * (1 << 30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.log({"loss": 0.01, "generation": stepstream.Text(huge)}, step=10)
        run.log({"loss": 0.009, "rollouts": stepstream.Table(columns=["a", "b"], rows=[[1, 2], [3]])}, step=11)
    del huge
    messages = [str(w.message) for w in caught]
    assert any("item_bytes" in m for m in messages), messages
    assert any("row 1" in m and "2 columns" in m for m in messages), messages
    with pytest.raises(TypeError):
        stepstream.Text(b"bytes")
    with pytest.raises(TypeError):
        stepstream.Table(columns="abc")
    report = run.finish()
    assert report["delivered"] and report["items_acked"] == 11 and report["items_refused"] == 2, report
    assert hub.series(run.run_id, "loss")[11] == 0.009
    gens = hub.api(f"/api/runs/{run.run_id}/samples?key=generation&from_step=0")["samples"]
    assert [g["body"] for g in gens] == [f"sample {s}" for s in range(10)]
    t = hub.api(f"/api/runs/{run.run_id}/samples?key=rollouts")["samples"][0]
    assert t["step"] == 9 and t["body"]["columns"] == ["prompt", "response", "reward"]
    assert t["body"]["rows"] == [["2+2=", "4", 1.0], ["capital of France?", "Paris", "NaN"]]
    assert hub.run(run.run_id)["records"] == 12


def test_printing_ten_thousand_lines_a_second_loses_none(hub, tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(textwrap.dedent(
        """
        import sys, time
        import stepstream
        run = stepstream.init(hub=sys.argv[1], name="chatty", run_id="con-chatty", archive_dir=None,
                              system_metrics=False)
        n = 0
        start = time.time()
        for step in range(50):
            run.log({"loss": 1.0}, step=step)
            for i in range(400):
                print(f"step {step} line {i}")
                n += 1
            time.sleep(max(0.0, start + (step + 1) * 0.04 - time.time()))
        run.finish()
        """
    ))
    proc = subprocess.run([sys.executable, str(script), hub.url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 20_000
    got = hub.api("/api/runs/con-chatty/console?from_step=0&limit=100000")
    texts = [l["text"] for l in got["lines"]]
    assert texts == [f"step {s} line {i}" for s in range(50) for i in range(400)]
    assert got["total"] == 20_000 and got["dropped"] == 0


def test_images_and_histograms_and_bad_ones_warn_while_the_run_goes_on(hub):
    import io
    import urllib.request

    import numpy as np
    import torch
    from PIL import Image as PILImage

    run = stepstream.init(hub=hub.url, name="media", archive_dir=None, system_metrics=False, console=False)
    rgb = (np.arange(6 * 4 * 3) % 251).astype(np.uint8).reshape(6, 4, 3)
    chw = torch.linspace(0, 1, 2 * 3 * 5).reshape(2, 3, 5)[:1]  # 1 x 3 x 5, floats in [0, 1]
    pil = PILImage.fromarray(rgb[:, :, 0], mode="L")
    values = np.array([0.0, 1.0, 2.0, 3.0, np.nan, np.inf])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.log({"loss": 1.0, "img": stepstream.Image(rgb, caption="rgb"), "hist": stepstream.Histogram(values, bins=3)}, step=0)
        run.log({"loss": 0.9, "img": stepstream.Image(chw, caption="chw")}, step=1)
        run.log({"loss": 0.8, "img": stepstream.Image(pil, caption="pil", format="jpeg")}, step=2)
        # Bad: a volume, NaN pixels, an image too large once encoded (noise: ~3 MB of PNG).
        run.log({"loss": 0.7, "img": stepstream.Image(np.zeros((10, 10, 10)))}, step=3)
        run.log({"loss": 0.6, "img": stepstream.Image(np.full((4, 4), np.nan))}, step=4)
        noise = np.random.default_rng(0).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
        run.log({"loss": 0.5, "img": stepstream.Image(noise)}, step=5)
    messages = [str(w.message) for w in caught]
    assert any("not 10 (shape (10, 10, 10)" in m for m in messages), messages
    assert any("NaN" in m for m in messages), messages
    with pytest.raises(ValueError, match="bins"):
        stepstream.Histogram(values, bins=0)
    hub.wait("the refusal of the large image", lambda: "item_bytes" in (run._native.last_error or ""))
    report = run.finish()
    assert report["delivered"], report
    assert report["items_acked"] == 4 and report["items_refused"] == 3, report
    assert sorted(hub.series(run.run_id, "loss")) == [0, 1, 2, 3, 4, 5]
    imgs = hub.api(f"/api/runs/{run.run_id}/samples?key=img&from_step=0")["samples"]
    assert [(i["step"], i["body"]["caption"]) for i in imgs] == [(0, "rgb"), (1, "chw"), (2, "pil")]

    def fetch(sample):
        with urllib.request.urlopen(f"http://127.0.0.1:{hub.port}{sample['body']['src']}") as r:
            return r.headers.get_content_type(), r.read()

    kind, png = fetch(imgs[0])
    assert kind == "image/png"
    assert (np.asarray(PILImage.open(io.BytesIO(png))) == rgb).all()
    _, png = fetch(imgs[1])
    got = np.asarray(PILImage.open(io.BytesIO(png)))
    # One channel first (C x H x W), floats in [0, 1]: a gray 5 x 3 image.
    assert got.shape == (3, 5)
    assert got[0, 0] == 0 and got[2, 4] == round(14 / 29 * 255)
    kind, jpeg = fetch(imgs[2])
    assert kind == "image/jpeg" and PILImage.open(io.BytesIO(jpeg)).size == (4, 6)
    h = hub.api(f"/api/runs/{run.run_id}/samples?key=hist")["samples"][0]["body"]
    assert h["counts"] == [1.0, 1.0, 2.0] and h["nan"] == 1 and h["pos_inf"] == 1
    assert (h["lo"], h["hi"]) == (0.0, 3.0)


def test_the_device_histogram_agrees_with_numpys():
    # `_torch_pack` is what runs on an accelerator (no host sync); here on the CPU, against
    # numpy's histogram of the same values.
    import numpy as np
    import torch

    from stepstream._samples import _numpy_pack, _torch_pack

    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_000, generator=g)
    x[::1000] = float("nan")
    x[1] = float("inf")
    x[2] = float("-inf")
    dev = _torch_pack(x, 32).tolist()
    host = _numpy_pack(x.numpy(), 32).tolist()
    assert dev[2:5] == host[2:5] == [100.0, 1.0, 1.0]
    assert dev[0] == pytest.approx(host[0]) and dev[1] == pytest.approx(host[1])
    assert sum(dev[5:]) == sum(host[5:]) == 100_000 - 102
    assert max(abs(a - b) for a, b in zip(dev[5:], host[5:])) <= 2
    # Constant and empty tensors.
    assert _torch_pack(torch.full((10,), 3.0), 4).tolist()[:2] == [2.5, 3.5]
    assert sum(_torch_pack(torch.zeros(0), 4).tolist()) == 0
