"""Alert delivery end to end: the real hub, real HTTP receivers and a real SMTP server on
loopback, a real run that goes NaN."""

import base64
import hashlib
import hmac
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import stepstream
from conftest import free_port

aiosmtpd = pytest.importorskip("aiosmtpd")  # scripts/test installs it
from aiosmtpd.controller import Controller  # noqa: E402


class Receiver:
    """Records every POST; `/flaky` answers 500 twice before accepting."""

    def __init__(self):
        self.requests = []
        self.flaky_failures = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                url = urllib.parse.urlparse(self.path)
                if url.path == "/flaky" and outer.flaky_failures < 2:
                    outer.flaky_failures += 1
                    self.send_response(500)
                    self.end_headers()
                    return
                outer.requests.append((url.path, urllib.parse.parse_qs(url.query), json.loads(body), time.time()))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"errcode":0}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path):
        return [r for r in self.requests if r[0] == path]


class Mailbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.mail_from, envelope.rcpt_tos, envelope.content.decode()))
        return "250 OK"


def sign_ok_dingtalk(query, secret):
    ts = query["timestamp"][0]
    want = base64.b64encode(hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()).decode()
    return query["sign"][0] == want and abs(int(ts) / 1000 - time.time()) < 120


def sign_ok_feishu(body, secret):
    ts = body["timestamp"]
    want = base64.b64encode(hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()).decode()
    return body["sign"] == want


def test_every_channel_gets_the_alert_and_a_dead_one_delays_none(make_hub, tmp_path):
    http = Receiver()
    box = Mailbox()
    smtp = Controller(box, hostname="127.0.0.1", port=free_port())
    smtp.start()
    try:
        base = f"http://127.0.0.1:{http.port}"
        config = tmp_path / "alerts.toml"
        config.write_text(f"""
public_url = "http://hub.example:7070"
attempts = 4
[[channels]]
kind = "webhook"
url = "http://127.0.0.1:1/dead"
[[channels]]
kind = "webhook"
url = "{base}/hook"
[[channels]]
kind = "dingtalk"
url = "{base}/ding?access_token=T"
secret = "SEC-ding"
[[channels]]
kind = "wecom"
url = "{base}/wecom?key=K"
[[channels]]
kind = "feishu"
url = "{base}/feishu"
secret = "SEC-feishu"
[[channels]]
kind = "slack"
url = "{base}/slack"
[[channels]]
kind = "webhook"
url = "{base}/flaky"
[[channels]]
kind = "email"
server = "127.0.0.1:{smtp.port}"
from = "hub@lab.test"
to = ["oncall@lab.test"]
""")
        hub = make_hub("--alerts", str(config))
        run = stepstream.init(hub=hub.url, project="alerts", name="goes-nan", archive_dir=None, system_metrics=False)
        for step in range(40):
            run.log({"loss": float("nan") if step == 30 else 1.0 / (step + 1)}, step=step)
        run.flush()
        sent_at = time.time()
        hub.wait("the webhook", lambda: http.at("/hook"), timeout=10)
        first = http.at("/hook")[0]
        assert first[3] - sent_at < 3, "a dead channel's retries must not delay the others"
        body = first[2]
        assert (body["rule"], body["state"], body["step"], body["run_name"]) == ("non_finite", "fired", 30, "goes-nan")
        assert body["run_id"] == run.run_id and run.run_id in body["link"]

        hub.wait("every robot", lambda: all(http.at(p) for p in ["/ding", "/wecom", "/feishu", "/slack"]), timeout=10)
        _, q, ding, _ = http.at("/ding")[0]
        assert q["access_token"] == ["T"] and sign_ok_dingtalk(q, "SEC-ding")
        assert ding["msgtype"] == "markdown" and "non_finite" in ding["markdown"]["title"]
        assert "step: 30" in ding["markdown"]["text"]
        wecom = http.at("/wecom")[0][2]
        assert wecom["msgtype"] == "markdown" and "goes-nan" in wecom["markdown"]["content"]
        feishu = http.at("/feishu")[0][2]
        assert feishu["msg_type"] == "text" and sign_ok_feishu(feishu, "SEC-feishu")
        assert "loss is NaN at step 30" in feishu["content"]["text"]
        assert "http://hub.example:7070/?run=" in http.at("/slack")[0][2]["text"]

        hub.wait("the mail", lambda: box.messages, timeout=10)
        mail_from, rcpts, content = box.messages[0]
        assert mail_from == "hub@lab.test" and rcpts == ["oncall@lab.test"]
        assert "Subject: [stepstream ALERT] alerts/goes-nan: non_finite" in content and "step 30" in content

        # Retried with backoff until the flaky receiver accepts.
        hub.wait("the flaky channel", lambda: http.at("/flaky"), timeout=15)
        assert http.flaky_failures == 2
        # The resolved message follows; no storm of repeats.
        hub.wait("resolved", lambda: any(r[2]["state"] == "resolved" for r in http.at("/hook")), timeout=10)
        assert [r[2]["state"] for r in http.at("/hook")] == ["fired", "resolved"]
        run.finish()
    finally:
        smtp.stop()
