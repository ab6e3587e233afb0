"""The package without a framework: init/log/finish, the archive, failures, ranks, outages."""

import csv
import time

import numpy as np
import pytest

import stepstream


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_log_reaches_the_hub_and_the_archive(hub, tmp_path):
    run = stepstream.init(hub=hub.url, project="py", name="basic", config={"lr": 0.1, "layers": 2},
                          archive_dir=str(tmp_path), system_metrics=False)
    for step in range(50):
        run.log({"loss": 1.0 / (step + 1), "lr": np.float32(0.1), "tokens": np.int64(step), "nan": float("nan")}, step=step)
    report = run.finish()
    assert report["delivered"] and report["acked"] == 50 and report["dropped"] == 0
    info = hub.run(run.run_id)
    assert info["status"] == "finished" and info["records"] == 50
    assert info["config"] == {"layers": 2, "lr": 0.1}
    rows = read_csv(run.metrics_csv)
    assert [int(r["step"]) for r in rows] == list(range(50))
    assert run.metrics_csv.endswith("_metrics.csv") and "run_" in run.metrics_csv
    assert run.config_path.endswith("_config.json")
    hub_loss = hub.series(run.run_id, "loss")
    for r in rows:
        assert float(r["loss"]) == hub_loss[int(r["step"])]
        assert r["nan"] == "nan"
    assert abs(float(rows[3]["lr"]) - 0.1) < 1e-7


def test_keys_in_another_order_or_replaced_never_mix_up_metrics(hub):
    # `log` skips every lookup when a record's keys are the previous record's key objects in
    # the same order; here the order changes, a key is swapped for another of the same
    # count, a value turns into a bad one, and keys are fresh (non-interned) strings.
    run = stepstream.init(hub=hub.url, name="shapes", archive_dir=None, system_metrics=False)
    expected = {"a": {}, "b": {}, "c": {}}
    for step in range(40):
        if step % 4 == 0:
            rec = {"a": step + 0.1, "b": step + 0.2}
        elif step % 4 == 1:
            rec = {"b": step + 0.2, "a": step + 0.1}
        elif step % 4 == 2:
            rec = {"a": step + 0.1, "c": step + 0.3}
        else:
            rec = {"".join(["b"]): step + 0.2, "".join(["a"]): step + 0.1}
        run.log(rec, step=step)
        for k, v in rec.items():
            expected[k][step] = v
    run.log({"a": 1.0, "b": 2.0}, step=40)
    with pytest.raises(TypeError, match="numbers"):
        run.log({"a": 1.0, "b": "high"}, step=41)
    expected["a"][40], expected["b"][40] = 1.0, 2.0
    assert run.finish()["delivered"]
    for name, points in expected.items():
        assert hub.series(run.run_id, name) == points, name


def test_context_manager_marks_failures_with_the_exception(hub, tmp_path):
    with pytest.raises(ValueError):
        with stepstream.init(hub=hub.url, name="boom", archive_dir=None, system_metrics=False) as run:
            run.log({"loss": 1.0}, step=1)
            raise ValueError("loss went NaN at step 1")
    info = hub.run(run.run_id)
    assert info["status"] == "failed"
    assert info["status_message"].startswith("ValueError: loss went NaN at step 1 (at test_run.py:")


def test_bad_values_are_clear_errors():
    run = stepstream.init(hub="ws://127.0.0.1:9", name="x", archive_dir=None, system_metrics=False)
    with pytest.raises(TypeError, match="numbers"):
        run.log({"loss": "high"})
    with pytest.raises(TypeError, match="str"):
        run.log({1: 2.0})
    run.finish(timeout=0.1)


def test_linger_waits_for_company_unless_flushed_and_bad_values_are_refused(make_hub):
    # A hub with room asks collectors for no linger: each record goes at once.
    roomy = make_hub()
    run = stepstream.init(hub=roomy.url, project="py", name="roomy", archive_dir=None,
                          system_metrics=False, linger_ms=60_000)
    run.log({"loss": 1.0}, step=0)
    roomy.wait("a record on a hub with room", lambda: roomy.run(run.run_id)["records"] == 1,
               timeout=5)
    assert run.finish(timeout=10)["delivered"]
    # A hub that asks for a long linger (`--linger`): records wait for company.
    hub = make_hub("--linger", "60000")
    for bad in (-1.0, float("nan"), float("inf"), 60_001.0):
        with pytest.raises(ValueError, match="linger_ms"):
            stepstream.init(hub=hub.url, name="bad-linger", archive_dir=None, system_metrics=False,
                            linger_ms=bad)
    run = stepstream.init(hub=hub.url, project="py", name="linger", archive_dir=None,
                          system_metrics=False, linger_ms=60_000)
    hub.wait("the run to connect", lambda: run.connected)
    for step in range(5):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    time.sleep(0.5)
    assert hub.run(run.run_id)["records"] == 0, "records wait for their linger"
    run.flush()
    hub.wait("a flush to send what lingers", lambda: hub.run(run.run_id)["records"] == 5, timeout=5)
    started = time.monotonic()
    run.log({"loss": 0.1}, step=5)
    assert run.finish(timeout=10)["delivered"]
    assert time.monotonic() - started < 5, "finish does not wait for the linger"


def test_hub_down_at_start_then_up_gets_every_step(make_hub, tmp_path):
    hub = make_hub(start=False)
    run = stepstream.init(hub=hub.url, name="early", archive_dir=str(tmp_path), system_metrics=False,
                          memory_records=50)
    for step in range(300):
        run.log({"loss": float(step)}, step=step)
        if step == 150:
            spools = tmp_path / ".spool"
            hub.wait("the outage to spill to the spool",
                     lambda: any(p.name.startswith(run.run_id) and p.stat().st_size > 0
                                 for p in (spools.iterdir() if spools.exists() else [])), timeout=10)
            hub.start()
    report = run.finish(timeout=60)
    assert report["delivered"], report
    info = hub.run(run.run_id)
    assert info["records"] == 300 and info["last_step"] == 299
    assert sorted(hub.series(run.run_id, "loss")) == list(range(300))


def test_rank_detection_and_only_rank_zero_reports(monkeypatch, hub):
    assert stepstream.detect_rank({}) == (0, 1, 0)
    assert stepstream.detect_rank({"RANK_ID": "3", "RANK_SIZE": "8", "DEVICE_ID": "3"}) == (3, 8, 3)
    assert stepstream.detect_rank({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == (1, 2, 1)
    assert stepstream.detect_rank({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6"}) == (5, 6, 0)
    monkeypatch.setenv("RANK_ID", "2")
    monkeypatch.setenv("RANK_SIZE", "4")
    quiet = stepstream.init(hub=hub.url, name="ranked", archive_dir=None)
    assert not quiet.active
    quiet.log({"loss": 1.0}, step=1)
    monkeypatch.setenv("STEPSTREAM_JOB", "launch-7")
    loud = stepstream.init(hub=hub.url, name="ranked", all_ranks=True, archive_dir=None, system_metrics=False)
    loud.log({"loss": 1.0, "step_time": 0.1}, step=1)
    assert loud.finish()["delivered"]
    info = hub.run(loud.run_id)
    assert info["name"] == "ranked" and info["rank"] == 2 and info["world_size"] == 4
    assert info["job"] == "launch-7"


def test_system_metrics_are_sampled(hub):
    run = stepstream.init(hub=hub.url, name="sys", archive_dir=None, system_interval=0.2)
    run.log({"loss": 1.0}, step=0)
    hub.wait("host metrics", lambda: "sys/cpu_percent" in hub.run(run.run_id)["metrics"])
    values = hub.run(run.run_id)["last_values"]
    assert 0 <= values["sys/mem_percent"] <= 100
    run.finish()


def test_tensor_values_are_converted_in_batches(hub):
    class FakeTensor:
        """Counts conversions: a real device tensor would sync on each."""
        converted = 0

        def __init__(self, v):
            self.v = v

        def asnumpy(self):
            FakeTensor.converted += 1
            return np.array([self.v], dtype=np.float32)

    run = stepstream.init(hub=hub.url, name="tensors", archive_dir=None, system_metrics=False, defer_every=10)
    for step in range(25):
        run.log({"loss": FakeTensor(step * 0.5)}, step=step)
        if step == 8:
            assert FakeTensor.converted == 0, "log converted a tensor on the hot path"
    # Two batches of ten handed to the converter; the newest five still held.
    hub.wait("two batches converted", lambda: FakeTensor.converted == 20, timeout=10)
    time.sleep(0.2)
    assert FakeTensor.converted == 20
    assert run.finish()["delivered"]
    assert FakeTensor.converted == 25
    assert hub.series(run.run_id, "loss")[24] == 12.0


def test_held_tensors_of_slow_steps_reach_the_hub_a_step_later_not_a_batch_later(hub):
    """At a step every 0.2 s, waiting for ten held records would put the page two seconds
    behind: a record older than 50 ms goes with the next step's log."""

    class Tensor:
        def __init__(self, v):
            self.v = v

        def asnumpy(self):
            return np.array([self.v], dtype=np.float32)

    run = stepstream.init(hub=hub.url, name="slow-steps", archive_dir=None, system_metrics=False, defer_every=10)
    for step in range(4):
        run.log({"loss": Tensor(step + 0.5)}, step=step)
        time.sleep(0.2)
    # Steps 0..2 are out (step 3 waits for the next log or the finish), without a flush.
    series = hub.wait("steps 0..2 stored", lambda: (lambda s: s if len(s) >= 3 else None)(hub.series(run.run_id, "loss")),
                      timeout=10)
    assert series == {0: 0.5, 1: 1.5, 2: 2.5}
    assert run.finish()["delivered"]
    assert hub.series(run.run_id, "loss")[3] == 3.5


def test_held_tensors_are_read_off_the_training_thread_and_records_keep_their_order(hub, tmp_path):
    """A tensor whose read blocks (a device still computing) must not block `log`: the
    converter thread waits, training goes on; the plain records logged meanwhile queue behind
    the held ones, so the archive and the hub get every step once, in order."""
    import threading

    gate = threading.Event()
    readers = set()

    class SlowTensor:
        def __init__(self, v):
            self.v = v

        def asnumpy(self):
            readers.add(threading.get_ident())
            gate.wait(30)
            return np.array([self.v], dtype=np.float32)

    run = stepstream.init(hub=hub.url, name="slow-tensors", archive_dir=str(tmp_path), system_metrics=False,
                          defer_every=10)
    started = time.monotonic()
    for step in range(25):
        run.log({"loss": SlowTensor(step * 0.5), "plain": float(step)}, step=step)
    for step in range(25, 40):
        run.log({"loss": step * 0.5, "plain": float(step)}, step=step)
    # The reads block until the gate opens: `log` returned without waiting for one.
    assert time.monotonic() - started < 5, "log waited for a tensor read"
    assert not gate.is_set()
    gate.set()
    report = run.finish(timeout=30)
    assert report["delivered"] and report["acked"] == 40 and report["unconvertible"] == 0
    assert readers and threading.get_ident() not in readers, "a tensor was read on the training thread"
    rows = read_csv(run.metrics_csv)
    assert [int(r["step"]) for r in rows] == list(range(40))
    loss = hub.series(run.run_id, "loss")
    assert [loss[s] for s in range(40)] == [s * 0.5 for s in range(40)]


def test_wss_to_a_hub_with_a_private_ca(make_hub, tmp_path):
    """The Python collector over `wss://`: delivered when it trusts the hub's CA (`ca_file`),
    refused by TLS when it does not."""
    import json
    import ssl
    import urllib.request

    from conftest import make_pki

    ca, cert, key = make_pki(tmp_path)
    hub = make_hub("--tls-cert", str(cert), "--tls-key", str(key))
    url = f"wss://127.0.0.1:{hub.port}"
    run = stepstream.init(hub=url, name="over-tls", archive_dir=None, system_metrics=False,
                          ca_file=str(ca))
    for step in range(50):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.finish()["delivered"]
    stranger = stepstream.init(hub=url, name="no-ca", archive_dir=None, system_metrics=False)
    stranger.log({"loss": 1.0}, step=0)
    assert not stranger.finish(timeout=2)["delivered"]
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://127.0.0.1:{hub.port}/api/runs/{run.run_id}/series?metric=loss",
                                context=ctx, timeout=10) as r:
        assert len(json.loads(r.read())["steps"]) == 50


def test_config_with_nan_and_infinity_and_mixed_keys_starts_and_is_stored(hub):
    config = {"lr": float("nan"), "clip": float("inf"), "floor": float("-inf"), 3: "three", "nested": {"x": [float("nan")]}}
    run = stepstream.init(hub=hub.url, name="nan-config", config=config, archive_dir=None, system_metrics=False)
    run.log({"loss": 1.0}, step=0)
    report = run.finish(timeout=float("inf"))
    assert report["delivered"] and report["lost"] == 0 and report["refused"] == 0
    stored = hub.run(run.run_id)["config"]
    assert stored["lr"] == "NaN" and stored["clip"] == "Infinity" and stored["floor"] == "-Infinity"
    assert stored["3"] == "three" and stored["nested"] == {"x": ["NaN"]}


def test_finish_with_odd_timeouts_returns(tmp_path):
    # No hub at all: an infinite system interval must not panic, NaN and negative timeouts
    # return at once.
    run = stepstream.init(hub="ws://127.0.0.1:9", name="no-hub", archive_dir=None, system_interval=float("inf"))
    run.log({"loss": 1.0}, step=0)
    started = time.monotonic()
    assert not run.finish(timeout=float("nan"))["delivered"]
    assert time.monotonic() - started < 2.0
