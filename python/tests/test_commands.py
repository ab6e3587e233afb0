"""Commands from outside to a real training (CPU) of each framework: a stop (checkpoint
first) through `stepstream stop` (the page's Stop button: tests/commands.rs), a checkpoint that lets training go on, and a
read token that may not command. The run ends `stopped`, by whom and why; the command's
timeline says where it was honoured and what was saved."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import binary

HERE = Path(__file__).parent / "frameworks"
FRAMEWORKS = ["torch", "hf", "lightning", "keras", "paddle", "mindspore"]


def post(hub, run_id, body, token=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{hub.port}/api/runs/{run_id}/commands",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start(framework, hub, tmp_path, env=None):
    # Its warnings go to a file: a pipe nobody reads while it trains would fill and stall it.
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "stoppable.py"), framework, hub.url, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "stderr.log", "w"), text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )
    run_file = tmp_path / "run_id"

    def running():
        if proc.poll() is not None:
            raise AssertionError((tmp_path / "stderr.log").read_text()[-4000:])
        return run_file.exists() and (hub.run(run_file.read_text()).get("last_step") or 0) >= 3

    hub.wait(f"{framework} training to stream", lambda: running(), timeout=180)
    return proc, run_file.read_text()


def ended(proc):
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, Path(proc.args[4], "stderr.log").read_text()[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_training_is_stopped_at_its_next_step_with_a_checkpoint_first(framework, hub, tmp_path):
    proc, run_id = start(framework, hub, tmp_path)
    asked = time.time()
    # From the CLI, waiting for the answer and the run's end (pushed by the hub, not polled).
    cli = subprocess.run(
        [binary(), "stop", run_id, "--hub", hub.url, "--by", "tester", "--reason", "diverging", "--wait", "120"],
        capture_output=True, text=True, timeout=180,
    )
    assert cli.returncode == 0, cli.stderr
    assert "stop honoured at step" in cli.stdout and f"run {run_id} ended: stopped" in cli.stdout, cli.stdout
    r = ended(proc)
    print(f"{framework}: from the command to the training's end {r['ended_at'] - asked:.3f} s")
    info = hub.wait("the run to end", lambda: (lambda i: i if i["status"] != "running" else None)(hub.run(run_id)))
    assert info["status"] == "stopped", info
    assert "tester" in info["status_message"] and "diverging" in info["status_message"], info
    # It stopped at its next safe point, far before its 20,000 steps.
    assert r["steps"] < 2000, r
    (cmd,) = hub.api(f"/api/runs/{run_id}/commands")["commands"]
    assert cmd["action"] == "stop" and cmd["state"] == "honoured" and cmd["by"] == "tester", cmd
    assert cmd["step"] is not None and cmd["step"] <= info["last_step"] + 1, (cmd, info)
    # A checkpoint was written first, and the answer names it.
    assert r["checkpoints"], r
    assert "saved" in cmd["message"] and any(c.split(".")[0] in cmd["message"] for c in r["checkpoints"]), (cmd, r)
    # A stopped run takes no more commands.
    status, body = post(hub, run_id, {"action": "checkpoint"})
    assert status == 409 and "ended" in body["error"], body


def test_a_checkpoint_command_saves_once_and_training_goes_on(hub, tmp_path):
    proc, run_id = start("torch", hub, tmp_path)
    status, body = post(hub, run_id, {"action": "checkpoint", "by": "tester"})
    assert status == 201, body
    cid = body["commands"][0]["id"]

    def honoured():
        cmds = hub.api(f"/api/runs/{run_id}/commands")["commands"]
        return next((c for c in cmds if c["id"] == cid and c["state"] == "honoured"), None)

    cmd = hub.wait("the checkpoint to be honoured", honoured)
    at = hub.run(run_id)["last_step"]
    hub.wait("training to go on", lambda: hub.run(run_id)["last_step"] >= at + 10)
    assert hub.run(run_id)["status"] == "running"
    # A note is shown and honoured; then a stop without a checkpoint.
    assert post(hub, run_id, {"action": "note", "text": "lr halved", "by": "tester"})[0] == 201
    assert post(hub, run_id, {"action": "stop", "checkpoint": False})[0] == 201
    r = ended(proc)
    assert len(r["checkpoints"]) == 1, r
    assert r["checkpoints"][0] in cmd["message"], (cmd, r)
    cmds = hub.api(f"/api/runs/{run_id}/commands")["commands"]
    assert [(c["action"], c["state"]) for c in cmds] == [
        ("checkpoint", "honoured"), ("note", "honoured"), ("stop", "honoured")
    ], cmds
    assert hub.run(run_id)["status"] == "stopped"


def test_a_read_token_may_not_stop_a_training(make_hub, tmp_path):
    hub = make_hub("--write-token", "w-secret", "--read-token", "r-secret")
    hub.token = "r-secret"
    proc, run_id = start("torch", hub, tmp_path, env={"STEPSTREAM_WRITE_TOKEN": "w-secret"})
    try:
        for token in ["r-secret", None, "wrong"]:
            status, body = post(hub, run_id, {"action": "stop"}, token=token)
            assert status in (401, 403), (token, status, body)
        # The CLI with a read token is refused too, by name.
        cli = subprocess.run([binary(), "stop", run_id, "--hub", hub.url, "--token", "r-secret"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode != 0 and "403" in cli.stderr, cli.stderr
        assert post(hub, run_id, {"action": "stop"}, token="w-secret")[0] == 201
        ended(proc)
    finally:
        proc.kill()
