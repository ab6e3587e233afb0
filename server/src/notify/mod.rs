//! Alert notifications: where they go (`[[channels]]` in the alerts TOML file) and how.
//!
//! Every channel has its own task and bounded queue, so a channel that is down (retried with
//! backoff) never delays another channel, and nothing here ever blocks ingestion: the hub
//! only `try_send`s a notice. Each channel is its own file: its request (each robot's
//! documented shape; DingTalk and Feishu signed when a secret is configured) or, for email,
//! its message. Adding a channel is adding its file and its variant of [`Channel`].
//!
//! * `notice` — one alert event, rendered and escaped.
//! * `http` — posting, redaction and signatures, shared by the robots.
//! * `webhook`, `slack`, `wecom`, `dingtalk`, `feishu`, `email` — the channels.

mod dingtalk;
mod email;
mod feishu;
mod http;
mod notice;
mod slack;
mod webhook;
mod wecom;

pub use email::{Mail, MailTls};
pub use http::redact;
pub use notice::Notice;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The alerts file: rules, channels and delivery settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    pub rules: crate::alerts::Rules,
    pub channels: Vec<NamedChannel>,
    /// Base URL of the web app, for links in messages (e.g. `http://hub.lab:7070`).
    pub public_url: Option<String>,
    /// Attempts per notice and channel (with exponential backoff from 0.5 s).
    pub attempts: Option<u32>,
    /// What a rule's alert does besides notify (`[actions.RULE]`): off unless configured.
    pub actions: std::collections::BTreeMap<String, crate::alerts::actions::RuleAction>,
    /// Which endings of a run are notified (`[endings]`): off unless configured.
    pub endings: crate::alerts::actions::Endings,
}

impl AlertsConfig {
    /// The configured channels' labels (their `name`, else their kind), in order: all the
    /// page may know of them.
    pub fn channel_kinds(&self) -> Vec<String> {
        self.channels.iter().map(NamedChannel::label).collect()
    }

    /// The rules, actions and endings of the alerts file as TOML, for the page to show
    /// read-only; the channels (addresses, keys, passwords) are left out.
    pub fn operator_toml(&self) -> String {
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            rules: &'a crate::alerts::Rules,
            actions: &'a std::collections::BTreeMap<String, crate::alerts::actions::RuleAction>,
            endings: &'a crate::alerts::actions::Endings,
        }
        toml::to_string(&Shown {
            rules: &self.rules,
            actions: &self.actions,
            endings: &self.endings,
        })
        .unwrap_or_default()
    }

    pub fn load(path: &std::path::Path) -> Result<AlertsConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: AlertsConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        crate::alerts::actions::check(&config.actions, &config.endings)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let labels = config.channel_kinds();
        for (i, label) in labels.iter().enumerate() {
            if labels[..i].contains(label) && config.channels[i].name.is_some() {
                return Err(format!(
                    "{}: two channels are named {label:?}: give each its own name",
                    path.display()
                ));
            }
        }
        for wanted in &config.endings.channels {
            let known = labels.iter().any(|l| l == wanted)
                || config.channels.iter().any(|c| c.channel.name() == wanted);
            if !known {
                return Err(format!(
                    "{}: [endings] names channel {wanted:?}, which is neither a channel's name \
                     nor the kind of one (there are: {})",
                    path.display(),
                    labels.join(", ")
                ));
            }
        }
        for c in &config.channels {
            if let Channel::Email(mail) = &c.channel {
                mail.check()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
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
    /// Email over SMTP.
    Email(Mail),
}

/// A channel and the name the operator gave it (`name = "oncall-slack"` in its table), by
/// which `[endings]` and the page's rules pick it; unnamed, its kind names it.
#[derive(Clone, Debug)]
pub struct NamedChannel {
    pub name: Option<String>,
    pub channel: Channel,
}

impl NamedChannel {
    /// Its name, else its kind.
    pub fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.channel.name().to_string())
    }

    /// Whether `wanted` (a name or a kind) picks this channel.
    pub fn picked_by(&self, wanted: &str) -> bool {
        self.name.as_deref() == Some(wanted) || self.channel.name() == wanted
    }
}

impl<'de> Deserialize<'de> for NamedChannel {
    /// The channel's table with its `name` taken out; the rest is the channel, checked as
    /// strictly as ever.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let name = match table.remove("name") {
            None => None,
            Some(toml::Value::String(s)) if !s.trim().is_empty() && s.len() <= 64 => Some(s),
            Some(_) => return Err(D::Error::custom("a channel's name is 1 to 64 characters")),
        };
        let channel = Channel::deserialize(toml::Value::Table(table)).map_err(D::Error::custom)?;
        Ok(NamedChannel { name, channel })
    }
}

impl Channel {
    pub fn name(&self) -> &'static str {
        match self {
            Channel::Webhook { .. } => "webhook",
            Channel::Dingtalk { .. } => "dingtalk",
            Channel::Wecom { .. } => "wecom",
            Channel::Feishu { .. } => "feishu",
            Channel::Slack { .. } => "slack",
            Channel::Email(_) => "email",
        }
    }
}

/// The URL and JSON body a robot channel receives for `n` at unix time `now` (seconds);
/// `None` for email.
pub fn request(channel: &Channel, n: &Notice, now: f64) -> Option<(String, serde_json::Value)> {
    Some(match channel {
        Channel::Webhook { url } => return webhook::request(url, n),
        Channel::Slack { url } => slack::request(url, n),
        Channel::Wecom { url } => wecom::request(url, n),
        Channel::Dingtalk { url, secret } => dingtalk::request(url, secret.as_deref(), n, now),
        Channel::Feishu { url, secret } => feishu::request(url, secret.as_deref(), n, now),
        Channel::Email(_) => return None,
    })
}

fn deliver(channel: &Channel, n: &Notice) -> Result<(), String> {
    match channel {
        Channel::Email(mail) => email::send(mail, n),
        other => {
            let (url, body) =
                request(other, n, stepstream_protocol::unix_now()).expect("robot channel");
            http::post(&url, &body)
        }
    }
}

/// Fans notices out to the channels.
#[derive(Clone, Default)]
pub struct Notifier {
    /// Each channel's queue, with what picks it: its name and its kind.
    queues: Vec<(Option<String>, &'static str, mpsc::Sender<Notice>)>,
    pub public_url: Option<String>,
}

impl Notifier {
    pub fn start(config: &AlertsConfig) -> Notifier {
        let attempts = config.attempts.unwrap_or(6).max(1);
        let queues = config
            .channels
            .iter()
            .cloned()
            .map(|named| {
                let (tx, mut rx) = mpsc::channel::<Notice>(1024);
                let name = named.channel.name();
                let label = named.name.clone();
                let channel = Arc::new(named.channel);
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
                (label, name, tx)
            })
            .collect();
        Notifier {
            queues,
            public_url: config.public_url.clone(),
        }
    }

    /// The page's address for a run, for a notice (with `public_url`).
    pub fn link(&self, run_id: &str) -> Option<String> {
        self.public_url
            .as_ref()
            .map(|u| format!("{}/?run={run_id}", u.trim_end_matches('/')))
    }

    /// Queues a notice for every channel; never waits.
    pub fn send(&self, notice: Notice) {
        let _ = self.send_to(notice, &[]);
    }

    /// Queues a notice for the channels these names or kinds pick (every channel when
    /// empty); the labels (name, else kind) of those it went to.
    pub fn send_to(&self, notice: Notice, kinds: &[String]) -> Vec<String> {
        let mut sent = Vec::new();
        for (label, name, q) in &self.queues {
            let picked = kinds
                .iter()
                .any(|k| k == name || label.as_deref() == Some(k.as_str()));
            if !kinds.is_empty() && !picked {
                continue;
            }
            if q.try_send(notice.clone()).is_err() {
                tracing::warn!(channel = name, "alert queue full; notice dropped");
            }
            sent.push(label.clone().unwrap_or_else(|| name.to_string()));
        }
        sent
    }

    /// Each channel's label: its name, else its kind (all the page may know of it).
    pub fn labels(&self) -> Vec<String> {
        self.queues
            .iter()
            .map(|(label, name, _)| label.clone().unwrap_or_else(|| name.to_string()))
            .collect()
    }

    /// Whether `wanted` names a channel or the kind of one.
    pub fn picks(&self, wanted: &str) -> bool {
        self.queues
            .iter()
            .any(|(label, name, _)| *name == wanted || label.as_deref() == Some(wanted))
    }
}

#[cfg(test)]
mod tests {
    use super::http::{hmac_base64, url_encode};
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
mod named {
    #[test]
    fn channels_are_picked_by_name_or_kind_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            let path = dir.path().join("alerts.toml");
            std::fs::write(&path, text).unwrap();
            super::AlertsConfig::load(&path)
        };
        let two = "[[channels]]\nkind = \"webhook\"\nname = \"oncall\"\nurl = \"http://a\"\n\
                   [[channels]]\nkind = \"webhook\"\nname = \"team\"\nurl = \"http://b\"\n";
        let cfg = load(&format!(
            "{two}[endings]\nstatuses = [\"stopped\"]\nchannels = [\"oncall\"]\n"
        ))
        .unwrap();
        assert_eq!(cfg.channel_kinds(), vec!["oncall", "team"]);
        assert!(cfg.channels[0].picked_by("oncall") && cfg.channels[0].picked_by("webhook"));
        assert!(!cfg.channels[1].picked_by("oncall"));
        let err = load(&format!(
            "{two}[endings]\nstatuses = [\"stopped\"]\nchannels = [\"pager\"]\n"
        ))
        .unwrap_err();
        assert!(err.contains("neither a channel's name"), "{err}");
        let err = load("[[channels]]\nkind = \"slack\"\nname = \"x\"\nurl = \"http://a\"\n[[channels]]\nkind = \"webhook\"\nname = \"x\"\nurl = \"http://b\"\n").unwrap_err();
        assert!(err.contains("two channels are named"), "{err}");
        // A typo in a channel's table is still an error, its name taken out or not.
        assert!(
            load("[[channels]]\nkind = \"webhook\"\nname = \"a\"\nurll = \"http://a\"\n").is_err()
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
