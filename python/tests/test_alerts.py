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
from conftest import free_port, make_pki

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


def test_mail_over_starttls_and_implicit_tls_with_a_hostile_chinese_run_name(make_hub, tmp_path):
    """STARTTLS (AUTH only after it) and implicit TLS, to real aiosmtpd servers with a private
    CA; a run name holding CRLF is refused at the door, and one holding header text and Chinese
    arrives as one encoded subject, no header added."""
    import email
    import email.policy
    import ssl

    from aiosmtpd.smtp import AuthResult

    ca, cert, key = make_pki(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    logins = []

    def authenticator(label):
        def check(server, session, envelope, mechanism, auth_data):
            # On the STARTTLS server, `session.ssl` says whether the upgrade happened first;
            # the implicit-TLS server speaks nothing but TLS.
            logins.append((label, session.ssl is not None or label == "implicit"))
            return AuthResult(success=auth_data.login == b"hub" and auth_data.password == b"pw")
        return check

    starttls_box, implicit_box = Mailbox(), Mailbox()
    starttls = Controller(starttls_box, hostname="127.0.0.1", port=free_port(), tls_context=ctx,
                          require_starttls=True, authenticator=authenticator("starttls"), auth_require_tls=True)
    implicit = Controller(implicit_box, hostname="127.0.0.1", port=free_port(), ssl_context=ctx,
                          authenticator=authenticator("implicit"), auth_require_tls=False)
    starttls.start()
    implicit.start()
    try:
        config = tmp_path / "alerts.toml"
        config.write_text(f"""
attempts = 3
[[channels]]
kind = "email"
server = "127.0.0.1:{starttls.port}"
tls = "starttls"
ca_file = "{ca}"
username = "hub"
password = "pw"
from = "hub@lab.test"
to = ["oncall@lab.test"]
[[channels]]
kind = "email"
server = "127.0.0.1:{implicit.port}"
tls = "implicit"
ca_file = "{ca}"
username = "hub"
password = "pw"
from = "hub@lab.test"
to = ["oncall@lab.test"]
""")
        hub = make_hub("--alerts", str(config))
        # A name holding CRLF is refused at the hub's door (control characters never reach a
        # header, a log line or a label), and the collector says so rather than claim success.
        forged = stepstream.init(hub=hub.url, project="中文项目", name="训练\r\nBcc: thief@evil.test",
                                 archive_dir=None, system_metrics=False)
        forged.log({"loss": 1.0}, step=0)
        hub.wait("the refusal", lambda: "control character" in (forged._native.last_error or ""), timeout=10)
        report = forged.finish(timeout=3.0)
        assert not report["delivered"], report
        assert not any("Bcc" in r["name"] for r in hub.api("/api/runs")["runs"])
        # Without control characters, a header's worth of text stays in the one subject line.
        name = "训练 Bcc: thief@evil.test X-Injected: 1"
        run = stepstream.init(hub=hub.url, project="中文项目", name=name, archive_dir=None, system_metrics=False)
        for step in range(40):
            run.log({"loss": float("nan") if step == 30 else 1.0 / (step + 1)}, step=step)
        run.flush()
        hub.wait("both mails", lambda: starttls_box.messages and implicit_box.messages, timeout=20)
        for box in (starttls_box, implicit_box):
            mail_from, rcpts, content = box.messages[0]
            assert mail_from == "hub@lab.test" and rcpts == ["oncall@lab.test"], "no injected recipient"
            msg = email.message_from_string(content, policy=email.policy.default)
            assert msg["Bcc"] is None and msg["X-Injected"] is None, content
            subject = str(msg["Subject"])
            assert "\n" not in subject and "\r" not in subject
            assert subject.startswith("[stepstream ALERT] 中文项目/训练") and "non_finite" in subject, subject
            assert "=?utf-8?" in content.split("\n\n")[0].lower(), "RFC 2047 encoded in the raw header"
            assert msg["Date"] and msg["Message-ID"], content
            assert msg.get_content_type() == "text/plain" and msg.get_content_charset() == "utf-8"
            assert "step 30" in msg.get_content()
        # The resolved notice follows, once per channel: nothing sent twice.
        hub.wait("the resolved mails", lambda: len(starttls_box.messages) == 2 and len(implicit_box.messages) == 2, timeout=20)
        time.sleep(1)
        assert [len(starttls_box.messages), len(implicit_box.messages)] == [2, 2]
        # AUTH went over TLS only, and the password never crossed in clear.
        assert {label for label, _ in logins} == {"starttls", "implicit"}, logins
        assert all(over_tls for _, over_tls in logins), logins
        run.finish()
    finally:
        starttls.stop()
        implicit.stop()


def test_a_mail_password_without_tls_is_refused_at_start(tmp_path):
    import subprocess

    from conftest import binary

    config = tmp_path / "alerts.toml"
    config.write_text('[[channels]]\nkind = "email"\nserver = "127.0.0.1:25"\nusername = "u"\n'
                      'password = "p"\nfrom = "a@b.test"\nto = ["c@d.test"]\n')
    out = subprocess.run([binary(), "serve", "--bind", "127.0.0.1:0",
                          "--alerts", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "needs tls" in out.stderr, out.stderr


def test_a_failed_run_is_notified_with_its_last_console_lines(make_hub, tmp_path):
    http = Receiver()
    base = f"http://127.0.0.1:{http.port}"
    config = tmp_path / "alerts.toml"
    config.write_text(f"""
public_url = "http://hub.example:7070"
[[channels]]
kind = "webhook"
url = "{base}/hook"
[[channels]]
kind = "dingtalk"
url = "{base}/ding?access_token=T"
""")
    hub = make_hub("--alerts", str(config))
    script = tmp_path / "crash.py"
    script.write_text(
        "import sys, stepstream\n"
        "run = stepstream.init(hub=sys.argv[1], project='alerts', name='crash', run_id='crash-1',\n"
        "                      archive_dir=None, system_metrics=False)\n"
        "for step in range(5):\n"
        "    run.log({'loss': 1.0}, step=step)\n"
        "    print(f'step {step}: loss 1.0', flush=True)\n"
        "def forward():\n"
        "    print('about to fail **now** <@all>', flush=True)\n"
        "    raise MemoryError('out of device memory in forward')\n"
        "forward()\n"
    )
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(script), hub.url], capture_output=True, timeout=120)
    assert proc.returncode == 1
    hub.wait("the failure's notice", lambda: http.at("/hook") and http.at("/ding"), timeout=15)
    body = http.at("/hook")[0][2]
    assert body["rule"] == "run_failed" and body["state"] == "fired" and body["run_id"] == "crash-1"
    assert body["link"] == "http://hub.example:7070/?run=crash-1"
    message = body["message"]
    assert message.startswith("MemoryError: out of device memory in forward (at crash.py:")
    # The last lines of the console: the traceback's end and what was printed before it.
    assert "MemoryError: out of device memory in forward" in message.split("last lines of its console:")[1]
    assert "raise MemoryError" in message and "about to fail **now** <@all>" in message
    # A robot's markdown gets the lines made inert: no emphasis, no mention of everyone.
    ding = http.at("/ding")[0][2]["markdown"]["text"]
    assert "about to fail \\*\\*now\\*\\* &lt;@all&gt;" in ding, ding
    assert "<@all>" not in ding
    assert hub.run("crash-1")["status"] == "failed"


def test_a_rule_stops_a_diverging_mindspore_run_within_its_grace_period(make_hub, tmp_path):
    """`[actions.divergence]`: notify now, stop (a checkpoint first) after 2 s unless someone
    acknowledges; the stop's notice says what it saved."""
    import json as _json
    import subprocess
    import sys
    from pathlib import Path

    http = Receiver()
    config = tmp_path / "alerts.toml"
    config.write_text(f"""
public_url = "http://hub.example:7070"
[[channels]]
kind = "webhook"
url = "http://127.0.0.1:{http.port}/hook"
[rules.divergence]
warmup_steps = 20
smoothing = 5
lookback = 10
consecutive = 5
[actions.divergence]
act = "stop"
grace_s = 2
[endings]
statuses = ["stopped"]
""")
    hub = make_hub("--alerts", str(config))
    script = Path(__file__).parent / "frameworks" / "diverging_ms.py"
    proc = subprocess.run([sys.executable, str(script), hub.url, str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = _json.loads(proc.stdout.strip().splitlines()[-1])
    run_id = r["run_id"]
    info = hub.run(run_id)
    assert info["status"] == "stopped", info
    assert info["status_message"].startswith("stopped by rule:divergence"), info
    # It was stopped long before its 20,000 steps, a checkpoint saved first.
    assert r["steps"] < 2000 and r["checkpoints"], r
    alerts = hub.api(f"/api/runs/{run_id}/alerts")["alerts"]
    fired = next(a for a in alerts if a["rule"] == "divergence" and a["state"] == "fired")
    assert "will save a checkpoint and stop this run in 2 s" in fired["message"], fired
    (cmd,) = hub.api(f"/api/runs/{run_id}/commands")["commands"]
    assert (cmd["action"], cmd["by"], cmd["state"]) == ("stop", "rule:divergence", "honoured"), cmd
    # The grace period, then the next step: from the alert to the stop within it and a little.
    took = r["ended_at"] - fired["at"]
    print(f"alert to stop: {took:.2f} s (grace 2 s)")
    assert 2.0 <= took < 10.0, took
    hub.wait("the stop's notice", lambda: any(b["rule"] == "run_stopped" for _, _, b, _ in http.at("/hook")))
    bodies = [b for _, _, b, _ in http.at("/hook")]
    assert any(b["rule"] == "divergence" and b["state"] == "fired" for b in bodies), bodies
    stopped = next(b for b in bodies if b["rule"] == "run_stopped")
    assert stopped["state"] == "ended" and "saved about" in stopped["message"], stopped
    assert "accelerator-" in stopped["message"] and "of 20000 steps left" in stopped["message"], stopped


def test_acknowledging_calls_off_a_rule_action_a_mute_silences_and_a_training_raises_its_own(make_hub, tmp_path):
    import subprocess
    import sys
    import urllib.request

    http = Receiver()
    config = tmp_path / "alerts.toml"
    config.write_text(f"""
[[channels]]
kind = "webhook"
url = "http://127.0.0.1:{http.port}/hook"
[rules]
cooldown_s = 0
[actions.non_finite]
act = "stop"
grace_s = 3
[endings]
statuses = ["finished", "stopped"]
channels = ["webhook"]
""")
    hub = make_hub("--alerts", str(config))
    script = tmp_path / "nan.py"
    flag = tmp_path / "go"
    script.write_text(
        "import os, sys, time, stepstream\n"
        "run = stepstream.init(hub=sys.argv[1], project='rules', name='nan', run_id='nan-1',\n"
        "                      archive_dir=None, system_metrics=False, console=False)\n"
        "step = 0\n"
        "def log(v):\n"
        "    global step\n"
        "    run.log({'loss': v}, step=step); run.flush(); step += 1; time.sleep(0.05)\n"
        "for _ in range(5): log(1.0)\n"
        "log(float('nan'))\n"
        "while not os.path.exists(sys.argv[2] + '.1'):\n"
        "    log(1.0)\n"
        "    if run.should_stop: sys.exit(3)\n"
        "log(float('nan'))\n"
        "run.alert('eval regressed', 'bleu 31.2 -> 27.9', level='error')\n"
        "run.alert('eval regressed', 'again, within the minute')\n"
        "while not os.path.exists(sys.argv[2] + '.2'):\n"
        "    log(1.0)\n"
        "run.finish()\n"
    )
    proc = subprocess.Popen([sys.executable, str(script), hub.url, str(flag)])
    try:
        hub.wait("the first NaN's notice", lambda: [b for _, _, b, _ in http.at("/hook") if b["rule"] == "non_finite"])
        ack = urllib.request.Request(
            f"http://127.0.0.1:{hub.port}/api/runs/nan-1/alerts/non_finite/ack",
            data=b'{"by": "oncall", "mute_hours": 1}', headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(ack, timeout=10) as r:
            body = json.loads(r.read())
        assert body["by"] == "oncall" and body["mute_until"] > time.time() + 3500, body
        time.sleep(4)  # past the grace period: acknowledged, so no stop
        assert proc.poll() is None, "the training was stopped though the alert was acknowledged"
        assert hub.api("/api/runs/nan-1/commands")["commands"] == []
        (tmp_path / "go.1").touch()
        # A second NaN fires again (stored, shown), but the mute keeps it off the channels.
        hub.wait("the second NaN", lambda: sum(a["rule"] == "non_finite" and a["state"] == "fired"
                                               for a in hub.api("/api/runs/nan-1/alerts")["alerts"]) == 2)
        hub.wait("the training's own alert", lambda: [b for _, _, b, _ in http.at("/hook") if b["rule"] == "user:eval regressed"])
        (tmp_path / "go.2").touch()
        assert proc.wait(timeout=60) == 0
        hub.wait("the finished notice", lambda: [b for _, _, b, _ in http.at("/hook") if b["rule"] == "run_finished"])
        time.sleep(1)
        bodies = [b for _, _, b, _ in http.at("/hook")]
        assert sum(b["rule"] == "non_finite" and b["state"] == "fired" for b in bodies) == 1, bodies
        user = [b for b in bodies if b["rule"] == "user:eval regressed"]
        assert len(user) == 1 and user[0]["message"] == "[error] eval regressed: bleu 31.2 -> 27.9", user
        acks = hub.api("/api/runs/nan-1/alerts")["acks"]
        assert [(a["rule"], a["by"]) for a in acks] == [("non_finite", "oncall")]
        # The run finished before the second alert's grace period was out: nothing to stop.
        assert hub.run("nan-1")["status"] == "finished"
    finally:
        proc.kill()


def test_a_killed_run_is_told_to_the_channel_its_endings_name(make_hub, tmp_path):
    import subprocess
    import sys

    http = Receiver()
    config = tmp_path / "alerts.toml"
    config.write_text(f"""
[[channels]]
kind = "webhook"
name = "oncall"
url = "http://127.0.0.1:{http.port}/oncall"
[[channels]]
kind = "webhook"
name = "team"
url = "http://127.0.0.1:{http.port}/team"
[endings]
statuses = ["killed"]
channels = ["oncall"]
""")
    hub = make_hub("--alerts", str(config))
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import sys, stepstream\n"
        "with stepstream.init(hub=sys.argv[1], project='alerts', name='interrupted', run_id='killed-1',\n"
        "                     archive_dir=None, system_metrics=False, console=False) as run:\n"
        "    for step in range(5):\n"
        "        run.log({'loss': 1.0}, step=step)\n"
        "    raise KeyboardInterrupt\n"
    )
    proc = subprocess.run([sys.executable, str(script), hub.url], capture_output=True, timeout=120)
    assert proc.returncode != 0
    assert hub.run("killed-1")["status"] == "killed"
    hub.wait("the killed notice", lambda: http.at("/oncall"))
    body = http.at("/oncall")[0][2]
    assert (body["rule"], body["state"], body["run_id"]) == ("run_killed", "ended", "killed-1"), body
    assert "KeyboardInterrupt" in body["message"], body
    time.sleep(0.5)
    assert http.at("/team") == [], "the other channel is not named by [endings]"
