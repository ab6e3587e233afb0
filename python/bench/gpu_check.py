"""The GPU path on a machine with an NVIDIA GPU (not a test: CI has no GPU).

    STEPSTREAM_BIN=target/release/stepstream python python/bench/gpu_check.py

Needs PyTorch with CUDA and the stepstream wheel in this Python. Starts a hub, then:

1. trains a small MLP on the GPU for 400 steps, logging loss, grad norm (`stepstream.torch`)
   and lr as CUDA tensors, under PyTorch's sync debug mode, and counts the device syncs:
   they must be the collector's batched host copies (one per `defer_every` steps), none in
   the steps themselves;
2. checks every step reached the hub with the values the device computed;
3. samples the GPU through NVML (`system_interval`) and compares its memory total with
   what CUDA reports.

Prints the numbers for the note; exits non-zero when a check fails.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings

import torch

import stepstream
import stepstream.torch as sst
from stepstream import _tensors


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.loads(r.read())


def main():
    # --cpu: a dry run of this script's own logic where there is no GPU (no NVML check).
    on_cpu = "--cpu" in sys.argv
    if not on_cpu and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to PyTorch")
    port = free_port()
    hub = subprocess.Popen([os.environ.get("STEPSTREAM_BIN", "stepstream"), "serve", "--bind",
                            f"127.0.0.1:{port}", "--db", os.path.join(tempfile.mkdtemp(), "hub.db")],
                           stdout=subprocess.PIPE)
    hub.stdout.readline()
    failures = []
    try:
        dev = torch.device("cpu" if on_cpu else "cuda")
        print(f"device: {'CPU (dry run)' if on_cpu else torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(4096, 256, device=dev), torch.randint(0, 10, (4096,), device=dev)
        run = stepstream.init(hub=f"ws://127.0.0.1:{port}", project="gpu", name="cuda-mlp",
                              archive_dir=None, system_interval=0.5, framework="pytorch")
        steps, defer = 400, 10
        kept = []
        if not on_cpu:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        copies0 = _tensors.stats["host_copies"]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            for step in range(steps):
                i = (step * 256) % 4096
                loss = torch.nn.functional.cross_entropy(model(x[i:i + 256]), y[i:i + 256])
                loss.backward()
                norm = sst.grad_norm(model)
                opt.step()
                opt.zero_grad()
                run.log({"loss": loss.detach(), "grad_norm": norm, "lr": sst.lr(opt)}, step=step)
                kept.append((loss.detach(), norm))
            elapsed = time.perf_counter() - t0
        if not on_cpu:
            torch.cuda.set_sync_debug_mode(0)
        syncs = sum("synchroniz" in str(w.message) for w in seen)
        copies = _tensors.stats["host_copies"] - copies0
        print(f"{steps} steps in {elapsed:.2f} s; device syncs seen: {syncs}; collector host copies: "
              f"{copies} (one per {defer} steps would be {steps // defer - 1} before finish)")
        if syncs > copies:
            failures.append(f"{syncs} syncs for {copies} batched host copies: a step synced")
        time.sleep(1.5)  # two NVML samples
        report = run.finish(timeout=60)
        info = api(port, f"/api/runs/{run.run_id}")
        if info["records"] < steps:
            failures.append(f"the hub has {info['records']} records of {steps}")
        series = api(port, f"/api/runs/{run.run_id}/series?metric=grad_norm&budget=100000")
        got = dict(zip(series["steps"], series["values"]))
        worst = max(abs(got[s] - float(n)) for s, (_, n) in enumerate(kept))
        print(f"delivered={report['delivered']} records={info['records']}; grad norm off by at most {worst:.3g}")
        if worst > 1e-6:
            failures.append(f"grad norm differs by {worst}")
        if on_cpu:
            return
        total = torch.cuda.get_device_properties(0).total_memory / 1e9
        nvml = info["last_values"].get("gpu0/mem_total_gb")
        print(f"NVML gpu0/mem_total_gb={nvml}, CUDA total {total:.2f} GB; "
              f"gpu metrics: {sorted(k for k in info['last_values'] if k.startswith('gpu'))}")
        if nvml is None or abs(nvml - total) > 0.05 * total:
            failures.append(f"NVML memory total {nvml} against CUDA's {total:.2f} GB")
    finally:
        hub.terminate()
    if failures:
        sys.exit("FAILED: " + "; ".join(failures))
    print("GPU path: all checks passed")


if __name__ == "__main__":
    main()
