"""A real `stepstream serve` process per test, on a free loopback port."""

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def binary() -> str:
    path = os.environ.get("STEPSTREAM_BIN") or str(ROOT / "target" / "debug" / "stepstream")
    assert os.path.exists(path), f"build the hub first (cargo build): {path}"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    def __init__(self, tmp: Path, port: int, extra=()):
        self.port = port
        self.db = tmp / "hub.db"
        self.extra = list(extra)
        self.proc = None
        # A read token for the API, where the hub guards reads.
        self.token = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            [binary(), "serve", "--bind", f"127.0.0.1:{self.port}", "--db", str(self.db), *self.extra],
            stdout=subprocess.PIPE, env={**os.environ, "RUST_LOG": os.environ.get("HUB_LOG", "warn")}, text=True,
        )
        line = self.proc.stdout.readline()
        assert "listening" in line, line
        return self

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def api(self, path: str):
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return json.loads(body) if r.headers.get_content_type() == "application/json" else body.decode()

    def run(self, run_id: str):
        return self.api(f"/api/runs/{run_id}")

    def series(self, run_id: str, metric: str):
        s = self.api(f"/api/runs/{run_id}/series?metric={metric}&budget=1000000")
        return dict(zip(s["steps"], s["values"]))

    def wait(self, what, predicate, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                v = predicate()
            except Exception:  # noqa: BLE001 - the hub may be starting
                v = None
            if v:
                return v
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def make_hub(tmp_path):
    hubs = []

    def make(*extra, start=True, port=None):
        hub = Hub(tmp_path, port or free_port(), extra)
        hubs.append(hub)
        return hub.start() if start else hub

    yield make
    for h in hubs:
        h.stop()


@pytest.fixture
def hub(make_hub):
    return make_hub()


def make_pki(tmp_path):
    """A private CA and a server certificate for 127.0.0.1 signed by it (and the server's key),
    made with the openssl CLI: ``(ca.pem, cert.pem, key.pem)``. A self-signed CA certificate
    cannot serve as the server's own: rustls refuses a CA used as an end entity."""

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", "ca.key",
            "-out", "ca.pem", "-subj", "/CN=stepstream test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "leaf.csr",
            "-subj", "/CN=127.0.0.1")
    (tmp_path / "leaf.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "cert.pem", "-days", "1", "-extfile", "leaf.ext")
    return tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
