//! Alert notifications: where they go (`[[channels]]` in the alerts TOML file) and how.
//!
//! Every channel has its own task and bounded queue, so a channel that is down (retried with
//! backoff) never delays another channel, and nothing here ever blocks ingestion: the hub
//! only `try_send`s a notice. Bodies follow each robot's documented shape; DingTalk and
//! Feishu requests are signed when a secret is configured.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::json;
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The alerts file: rules, channels and delivery settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    pub rules: crate::alerts::Rules,
    pub channels: Vec<Channel>,
    /// Base URL of the web app, for links in messages (e.g. `http://hub.lab:7070`).
    pub public_url: Option<String>,
    /// Attempts per notice and channel (with exponential backoff from 0.5 s).
    pub attempts: Option<u32>,
}

impl AlertsConfig {
    pub fn load(path: &std::path::Path) -> Result<AlertsConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: AlertsConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for c in &config.channels {
            if let Channel::Email {
                tls,
                starttls,
                password: Some(_),
                ..
            } = c
            {
                if tls.unwrap_or(if *starttls {
                    MailTls::Starttls
                } else {
                    MailTls::None
                }) == MailTls::None
                {
                    return Err(format!(
                        "{}: an email channel with a password needs tls = \"starttls\" or \"implicit\" \
                         (the password would cross the network in clear)",
                        path.display()
                    ));
                }
            }
        }
        Ok(config)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Channel {
    /// POSTs the notice as JSON.
    Webhook { url: String },
    /// DingTalk custom robot; `secret` enables its signature.
    Dingtalk { url: String, secret: Option<String> },
    /// WeCom (enterprise WeChat) group robot.
    Wecom { url: String },
    /// Feishu / Lark custom bot; `secret` enables its signature.
    Feishu { url: String, secret: Option<String> },
    /// Slack incoming webhook.
    Slack { url: String },
    /// Email over SMTP (lettre): `tls = "starttls"` (port 587), `"implicit"` (465) or
    /// `"none"` (a local relay; no password is ever sent without TLS). `ca_file` trusts a
    /// private CA besides the public roots.
    Email {
        server: String,
        #[serde(default)]
        tls: Option<MailTls>,
        /// Older spelling of `tls = "starttls"`.
        #[serde(default)]
        starttls: bool,
        ca_file: Option<std::path::PathBuf>,
        username: Option<String>,
        password: Option<String>,
        from: String,
        to: Vec<String>,
    },
}

/// How mail reaches its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MailTls {
    None,
    Starttls,
    Implicit,
}

impl Channel {
    pub fn name(&self) -> &'static str {
        match self {
            Channel::Webhook { .. } => "webhook",
            Channel::Dingtalk { .. } => "dingtalk",
            Channel::Wecom { .. } => "wecom",
            Channel::Feishu { .. } => "feishu",
            Channel::Slack { .. } => "slack",
            Channel::Email { .. } => "email",
        }
    }
}

/// One alert event, as every channel renders it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Notice {
    pub run_id: String,
    pub project: String,
    pub run_name: String,
    pub rule: String,
    /// `fired` or `resolved`.
    pub state: &'static str,
    pub step: i64,
    pub value: f64,
    pub message: String,
    pub at: f64,
    pub link: Option<String>,
}

/// Text people named (project, run, rule) or the hub wrote about them, made inert for a
/// channel that formats: a run named `**x**` or `[click](http://evil)` must show as itself,
/// and one holding `<@all>` or `<at user_id="all">` must not page a whole group.
#[derive(Clone, Copy)]
enum Escape {
    /// DingTalk's and WeCom's markdown: emphasis, code, link brackets and tables
    /// backslash-escaped (headings and lists at the start), `<`, `>` and `&` as entities
    /// (WeCom reads `<font>` and `<@user>` in it).
    Markdown,
    /// Slack's mrkdwn: `&`, `<` and `>` as entities, its documented escapes (formatting is
    /// also turned off for the message).
    Slack,
    /// Feishu's plain text: only its `<at ...>` tags are special; angle brackets become
    /// full-width ones.
    FeishuText,
}

fn escape(s: &str, how: Escape) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for (i, c) in s.chars().enumerate() {
        match (how, c) {
            // A heading or a list only where a line starts.
            (Escape::Markdown, '#' | '-' | '+') if i == 0 => {
                out.push('\\');
                out.push(c);
            }
            (Escape::Markdown, '<') | (Escape::Slack, '<') => out.push_str("&lt;"),
            (Escape::Markdown, '>') | (Escape::Slack, '>') => out.push_str("&gt;"),
            (Escape::Markdown, '&') | (Escape::Slack, '&') => out.push_str("&amp;"),
            (Escape::Markdown, c) if "\\`*_[]|~".contains(c) => {
                out.push('\\');
                out.push(c);
            }
            (Escape::FeishuText, '<') => out.push('\u{ff1c}'),
            (Escape::FeishuText, '>') => out.push('\u{ff1e}'),
            (_, c) => out.push(c),
        }
    }
    out
}

impl Notice {
    /// The notice with every field people control escaped for `how`.
    fn escaped(&self, how: Escape) -> Notice {
        Notice {
            project: escape(&self.project, how),
            run_name: escape(&self.run_name, how),
            rule: escape(&self.rule, how),
            message: escape(&self.message, how),
            ..self.clone()
        }
    }

    fn title(&self) -> String {
        let what = if self.state == "fired" {
            "ALERT"
        } else {
            "resolved"
        };
        format!(
            "[stepstream {what}] {}/{}: {}",
            self.project, self.run_name, self.rule
        )
    }

    fn text(&self) -> String {
        let mut t = format!(
            "{}\nrun {} ({}), step {}, value {}\n{}",
            self.title(),
            self.run_name,
            self.run_id,
            self.step,
            self.value,
            self.message
        );
        if let Some(link) = &self.link {
            t.push_str(&format!("\n{link}"));
        }
        t
    }

    fn markdown(&self) -> String {
        let mut t = format!(
            "### {}\n- run: **{}** (`{}`)\n- rule: **{}**\n- step: {}\n- value: {}\n\n{}",
            self.title(),
            self.run_name,
            self.run_id,
            self.rule,
            self.step,
            self.value,
            self.message
        );
        if let Some(link) = &self.link {
            t.push_str(&format!("\n\n[open the run]({link})"));
        }
        t
    }
}

fn hmac_base64(key: &[u8], message: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(message);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The URL and JSON body a robot channel receives for `n` at unix time `now` (seconds).
pub fn request(channel: &Channel, n: &Notice, now: f64) -> Option<(String, serde_json::Value)> {
    Some(match channel {
        Channel::Webhook { url } => (url.clone(), serde_json::to_value(n).ok()?),
        Channel::Slack { url } => (
            url.clone(),
            json!({ "text": n.escaped(Escape::Slack).text(), "mrkdwn": false }),
        ),
        Channel::Wecom { url } => (
            url.clone(),
            json!({ "msgtype": "markdown", "markdown": { "content": n.escaped(Escape::Markdown).markdown() } }),
        ),
        Channel::Dingtalk { url, secret } => {
            let body = json!({
                "msgtype": "markdown",
                "markdown": { "title": n.title(), "text": n.escaped(Escape::Markdown).markdown() },
            });
            let url = match secret {
                Some(secret) => {
                    // https://open.dingtalk.com: sign = base64(HMAC-SHA256(secret, "ts\nsecret"))
                    let ts = (now * 1000.0) as i64;
                    let sign = hmac_base64(secret.as_bytes(), format!("{ts}\n{secret}").as_bytes());
                    let sep = if url.contains('?') { '&' } else { '?' };
                    format!("{url}{sep}timestamp={ts}&sign={}", url_encode(&sign))
                }
                None => url.clone(),
            };
            (url, body)
        }
        Channel::Feishu { url, secret } => {
            let mut body = json!({ "msg_type": "text", "content": { "text": n.escaped(Escape::FeishuText).text() } });
            if let Some(secret) = secret {
                // open.feishu.cn: sign = base64(HMAC-SHA256(key = "ts\nsecret", message = ""))
                let ts = now as i64;
                body["timestamp"] = json!(ts.to_string());
                body["sign"] = json!(hmac_base64(format!("{ts}\n{secret}").as_bytes(), b""));
            }
            (url.clone(), body)
        }
        Channel::Email { .. } => return None,
    })
}

fn post(url: &str, body: &serde_json::Value) -> Result<(), String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    match agent
        .post(url)
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
    {
        Ok(_) => Ok(()),
        Err(ureq::Error::Status(code, r)) => Err(format!(
            "HTTP {code}: {}",
            r.into_string()
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect::<String>()
        )),
        // Not `e.to_string()`: ureq prints the whole URL, and a robot's URL is its secret
        // (DingTalk's `access_token` and `sign`, WeCom's `key`, Slack's path).
        Err(ureq::Error::Transport(t)) => Err(format!(
            "{} posting to {}{}",
            t.kind(),
            redact(url),
            t.message().map(|m| format!(": {m}")).unwrap_or_default()
        )),
    }
}

/// A URL without what may be secret in it: `scheme://host[:port]/…`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // `user:password@` is secret too.
    let host = authority.rsplit('@').next().unwrap_or(authority);
    format!("{scheme}://{host}/…")
}

/// A header-safe line: control characters (CR, LF...) in a project or run name become
/// spaces, so no name can start a header of its own.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Sends one notice by mail with lettre: `Date`, `Message-ID`, MIME and RFC 2047 encoded
/// headers (Chinese run names arrive intact), STARTTLS or implicit TLS, AUTH only over TLS.
fn send_mail(channel: &Channel, n: &Notice) -> Result<(), String> {
    use lettre::message::{header::ContentType, Mailbox};
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    use lettre::{SmtpTransport, Transport};
    let Channel::Email {
        server,
        tls,
        starttls,
        ca_file,
        username,
        password,
        from,
        to,
    } = channel
    else {
        return Err("not an email channel".into());
    };
    let mode = tls.unwrap_or(if *starttls {
        MailTls::Starttls
    } else {
        MailTls::None
    });
    let (host, port) = match server.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("bad port in {server:?}"))?,
        ),
        None => (
            server.as_str(),
            if mode == MailTls::Implicit { 465 } else { 587 },
        ),
    };
    let mut email = lettre::Message::builder()
        .from(
            from.parse::<Mailbox>()
                .map_err(|e| format!("from {from:?}: {e}"))?,
        )
        .subject(one_line(&n.title()))
        .message_id(None)
        .header(ContentType::TEXT_PLAIN);
    for rcpt in to {
        email = email.to(rcpt
            .parse::<Mailbox>()
            .map_err(|e| format!("to {rcpt:?}: {e}"))?);
    }
    let email = email.body(n.text()).map_err(|e| e.to_string())?;
    let tls_parameters = || -> Result<TlsParameters, String> {
        let mut b = TlsParameters::builder(host.to_string());
        if let Some(path) = ca_file {
            let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            b = b.add_root_certificate(Certificate::from_pem(&pem).map_err(|e| e.to_string())?);
        }
        b.build_rustls().map_err(|e| e.to_string())
    };
    let mut transport = SmtpTransport::builder_dangerous(host)
        .port(port)
        .timeout(Some(Duration::from_secs(30)))
        .tls(match mode {
            MailTls::None => Tls::None,
            MailTls::Starttls => Tls::Required(tls_parameters()?),
            MailTls::Implicit => Tls::Wrapper(tls_parameters()?),
        });
    if let (Some(user), Some(pass)) = (username, password) {
        transport = transport.credentials(Credentials::new(user.clone(), pass.clone()));
    }
    transport
        .build()
        .send(&email)
        .map(|_| ())
        .map_err(|e| format!("SMTP via {host}:{port}: {e}"))
}

fn deliver(channel: &Channel, n: &Notice) -> Result<(), String> {
    match channel {
        Channel::Email { .. } => send_mail(channel, n),
        other => {
            let (url, body) =
                request(other, n, stepstream_protocol::unix_now()).expect("robot channel");
            post(&url, &body)
        }
    }
}

/// Fans notices out to the channels.
#[derive(Clone, Default)]
pub struct Notifier {
    queues: Vec<(&'static str, mpsc::Sender<Notice>)>,
    pub public_url: Option<String>,
}

impl Notifier {
    pub fn start(config: &AlertsConfig) -> Notifier {
        let attempts = config.attempts.unwrap_or(6).max(1);
        let queues = config
            .channels
            .iter()
            .cloned()
            .map(|channel| {
                let (tx, mut rx) = mpsc::channel::<Notice>(1024);
                let name = channel.name();
                let channel = Arc::new(channel);
                tokio::spawn(async move {
                    while let Some(notice) = rx.recv().await {
                        let mut delay = Duration::from_millis(500);
                        for attempt in 1..=attempts {
                            let (c, n) = (channel.clone(), notice.clone());
                            let outcome = tokio::task::spawn_blocking(move || deliver(&c, &n))
                                .await
                                .unwrap_or_else(|e| Err(e.to_string()));
                            match outcome {
                                Ok(()) => {
                                    tracing::info!(channel = name, rule = %notice.rule, run = %notice.run_id, "alert delivered");
                                    break;
                                }
                                Err(e) if attempt < attempts => {
                                    tracing::warn!(channel = name, attempt, error = %e, "alert delivery failed; retrying");
                                    tokio::time::sleep(delay).await;
                                    delay = (delay * 2).min(Duration::from_secs(30));
                                }
                                Err(e) => {
                                    tracing::error!(channel = name, error = %e, "alert not delivered; giving up");
                                }
                            }
                        }
                    }
                });
                (name, tx)
            })
            .collect();
        Notifier {
            queues,
            public_url: config.public_url.clone(),
        }
    }

    /// Queues a notice for every channel; never waits.
    pub fn send(&self, notice: Notice) {
        for (name, q) in &self.queues {
            if q.try_send(notice.clone()).is_err() {
                tracing::warn!(channel = name, "alert queue full; notice dropped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_urls_keep_only_the_host() {
        assert_eq!(
            redact("https://oapi.dingtalk.com/robot/send?access_token=abc&sign=x"),
            "https://oapi.dingtalk.com/…"
        );
        assert_eq!(
            redact("https://u:p@hooks.slack.com/services/T/B/C"),
            "https://hooks.slack.com/…"
        );
    }

    fn notice() -> Notice {
        Notice {
            run_id: "r1".into(),
            project: "llama".into(),
            run_name: "lr-3e-4".into(),
            rule: "non_finite".into(),
            state: "fired",
            step: 250,
            value: f64::NAN,
            message: "loss is NaN at step 250".into(),
            at: 1.0,
            link: Some("http://hub/?run=r1".into()),
        }
    }

    #[test]
    fn dingtalk_signature_matches_its_documented_recipe() {
        let ch = Channel::Dingtalk {
            url: "https://oapi.dingtalk.com/robot/send?access_token=T".into(),
            secret: Some("SEC".into()),
        };
        let (url, body) = request(&ch, &notice(), 1_700_000_000.123).unwrap();
        let expected = hmac_base64(b"SEC", b"1700000000123\nSEC");
        assert!(url.contains("&timestamp=1700000000123&sign="), "{url}");
        assert!(url.ends_with(&url_encode(&expected)));
        assert_eq!(body["msgtype"], "markdown");
        assert!(body["markdown"]["text"]
            .as_str()
            .unwrap()
            .contains("step: 250"));
    }

    #[test]
    fn feishu_signature_and_shapes() {
        let ch = Channel::Feishu {
            url: "http://x".into(),
            secret: Some("S".into()),
        };
        let (_, body) = request(&ch, &notice(), 1_700_000_000.0).unwrap();
        assert_eq!(body["timestamp"], "1700000000");
        assert_eq!(body["sign"], hmac_base64(b"1700000000\nS", b""));
        assert!(body["content"]["text"]
            .as_str()
            .unwrap()
            .contains("lr-3e-4"));
        let (_, slack) = request(
            &Channel::Slack {
                url: "http://x".into(),
            },
            &notice(),
            0.0,
        )
        .unwrap();
        assert!(slack["text"]
            .as_str()
            .unwrap()
            .contains("http://hub/?run=r1"));
        let (_, wecom) = request(
            &Channel::Wecom {
                url: "http://x".into(),
            },
            &notice(),
            0.0,
        )
        .unwrap();
        assert_eq!(wecom["msgtype"], "markdown");
    }

    /// Names are people's: a run named to look like formatting, a link or a mention shows
    /// as itself on every channel that formats.
    #[test]
    fn names_and_messages_are_inert_on_every_formatting_channel() {
        let mut n = notice();
        n.project = "<@all> **p**".into();
        n.run_name = "[click](http://evil.example) <at user_id=\"all\">x</at>".into();
        n.message = "loss is NaN & *bad* <!channel>".into();
        let url = "http://x".to_string();
        let (_, ding) = request(
            &Channel::Dingtalk {
                url: url.clone(),
                secret: None,
            },
            &n,
            0.0,
        )
        .unwrap();
        let (_, wecom) = request(&Channel::Wecom { url: url.clone() }, &n, 0.0).unwrap();
        for md in [
            ding["markdown"]["text"].as_str().unwrap(),
            wecom["markdown"]["content"].as_str().unwrap(),
        ] {
            assert!(md.contains("&lt;@all&gt; \\*\\*p\\*\\*"), "{md}");
            assert!(md.contains("\\[click\\](http://evil.example)"), "{md}");
            assert!(md.contains("lr-3e-4") || !md.contains("lr"), "{md}");
            assert!(!md.contains("<at") && !md.contains("<@"), "{md}");
            assert!(md.contains("[open the run](http://hub/?run=r1)"), "{md}");
        }
        let (_, slack) = request(&Channel::Slack { url: url.clone() }, &n, 0.0).unwrap();
        let text = slack["text"].as_str().unwrap();
        assert!(
            text.contains("&lt;!channel&gt;") && text.contains("NaN &amp; *bad*"),
            "{text}"
        );
        assert!(!text.contains("<@") && !text.contains("<!"), "{text}");
        assert_eq!(slack["mrkdwn"], false);
        let (_, feishu) = request(&Channel::Feishu { url, secret: None }, &n, 0.0).unwrap();
        let text = feishu["content"]["text"].as_str().unwrap();
        assert!(
            !text.contains('<') && text.contains("\u{ff1c}at user_id"),
            "{text}"
        );
    }

    #[test]
    fn config_file_parses() {
        let cfg: AlertsConfig = toml::from_str(
            r#"
            public_url = "http://hub:7070"
            [rules.loss_spike]
            mads = 20.0
            [rules.memory]
            enabled = false
            [[channels]]
            kind = "dingtalk"
            url = "https://oapi.dingtalk.com/robot/send?access_token=T"
            secret = "SEC"
            [[channels]]
            kind = "email"
            server = "127.0.0.1:25"
            from = "hub@lab"
            to = ["oncall@lab"]
            "#,
        )
        .unwrap();
        assert_eq!(cfg.rules.loss_spike.mads, 20.0);
        assert!(!cfg.rules.memory.enabled);
        assert!(
            cfg.rules.non_finite.enabled,
            "unset rules keep their defaults"
        );
        assert_eq!(cfg.channels.len(), 2);
        assert!(
            toml::from_str::<AlertsConfig>("[rules.nope]\nx = 1").is_err(),
            "typos are errors"
        );
    }
}

#[cfg(test)]
mod example {
    #[test]
    fn the_documented_example_file_parses() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/alerts.example.toml");
        let cfg = super::AlertsConfig::load(&path).unwrap();
        assert_eq!(cfg.rules.grad_explosion.factor, 10.0);
        assert!(cfg.channels.is_empty());
    }
}
