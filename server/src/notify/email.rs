//! The email channel: one notice as one message over SMTP (lettre).

use super::notice::Notice;
use serde::Deserialize;
use std::time::Duration;

/// Email over SMTP (lettre): `tls = "starttls"` (port 587), `"implicit"` (465) or `"none"`
/// (a local relay; no password is ever sent without TLS). `ca_file` trusts a private CA
/// besides the public roots.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mail {
    pub server: String,
    #[serde(default)]
    pub tls: Option<MailTls>,
    /// Older spelling of `tls = "starttls"`.
    #[serde(default)]
    pub starttls: bool,
    pub ca_file: Option<std::path::PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub from: String,
    pub to: Vec<String>,
}

/// How mail reaches its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MailTls {
    None,
    Starttls,
    Implicit,
}

impl Mail {
    /// How this channel reaches its server.
    fn mode(&self) -> MailTls {
        self.tls.unwrap_or(if self.starttls {
            MailTls::Starttls
        } else {
            MailTls::None
        })
    }

    /// A password is never sent in clear: refused when the file is read.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.password.is_some() && self.mode() == MailTls::None {
            return Err(
                "an email channel with a password needs tls = \"starttls\" or \"implicit\" \
                 (the password would cross the network in clear)"
                    .into(),
            );
        }
        Ok(())
    }
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
pub(super) fn send(mail: &Mail, n: &Notice) -> Result<(), String> {
    use lettre::message::{header::ContentType, Mailbox};
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    use lettre::{SmtpTransport, Transport};
    let Mail {
        server,
        ca_file,
        username,
        password,
        from,
        to,
        ..
    } = mail;
    let mode = mail.mode();
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
