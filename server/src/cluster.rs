//! The NATS transport of several hubs as one (`--store postgres://... --nats nats://...`):
//! what one hub commits or decides reaches the viewers of every other hub through NATS.
//! This module only connects, publishes and receives; what a message means to a hub is
//! `hub/peer.rs`'s.
//!
//! Each hub publishes [`ToPeer`] messages on one subject, in the order it committed them,
//! after they committed; every hub subscribes and applies the others' messages to its own
//! memory and viewers (`Hub::apply_peer`, driven by `hub::follow` over an [`Inbox`]). NATS core may drop messages (a hub disconnected,
//! a slow consumer): nothing is lost by that, because the store has every batch before its
//! message leaves. A hub that sees a batch above the next one it expects reads the missing
//! ones from the store first, and a hub that (re)connects to NATS reads every run again, so
//! viewers still get each point exactly once.
//!
//! Publishing never waits: messages go through a bounded queue to a forwarding task; when
//! it is full a message is dropped, counted, and healed as above.

use axum::body::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use stepstream_protocol::ToPeer;
use tokio::sync::mpsc;

/// The one subject every hub of a cluster publishes on: one subject keeps one hub's
/// messages in the order it sent them (a run before its batches).
pub const SUBJECT: &str = "stepstream.peer";

/// Messages a hub may have queued for NATS before it drops (and counts) them.
const OUTBOX: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach NATS at {url}: {source}")]
    Connect {
        /// Without its `user:password@`.
        url: String,
        source: async_nats::ConnectError,
    },
    #[error("NATS credentials {path}: {source}")]
    Credentials {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot subscribe to {SUBJECT}: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("a cluster needs a shared store: pass --store postgres://... with --nats")]
    NotShared,
}

/// How a hub proves itself to NATS (all optional; a `nats://user:password@host` URL works
/// too). Secrets come from files, not the command line.
#[derive(Clone, Debug, Default)]
pub struct NatsAuth {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// An nkey seed (`SU...`).
    pub nkey_seed: Option<String>,
    /// A `.creds` file (a JWT and its nkey seed).
    pub creds_file: Option<std::path::PathBuf>,
    /// PEM certificate(s) of the CA that signed the NATS server's certificate; requires TLS.
    pub ca_file: Option<std::path::PathBuf>,
}

/// A NATS URL fit for a log line: its `user:password@` (or token) left out.
pub fn redacted(url: &str) -> String {
    url.split(',')
        .map(|one| match one.split_once("://") {
            Some((scheme, rest)) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
                format!("{scheme}://{host}")
            }
            None => one.rsplit_once('@').map_or(one, |(_, h)| h).to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// This hub's place in a cluster: its id, and its way out to the others.
pub struct Cluster {
    /// Random per process: names this hub in peer messages and judge leases.
    pub hub_id: u64,
    outbox: mpsc::Sender<Vec<u8>>,
    /// Messages dropped because the outbox was full.
    pub dropped: AtomicU64,
    client: async_nats::Client,
}

impl Cluster {
    /// Connects to NATS (retrying until it answers) and starts the forwarding task.
    pub async fn connect(
        url: &str,
        auth: &NatsAuth,
    ) -> Result<(Arc<Cluster>, Reconnects), ClusterError> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).expect("the OS random source");
        let hub_id = u64::from_le_bytes(id) | 1;
        let (reconnected, reconnects) = mpsc::channel(4);
        let mut options = async_nats::ConnectOptions::new();
        // `nats://user:password@host` (or `nats://token@host`): the client library does not
        // present a URL's credentials, so they are taken out and presented here.
        let mut auth = auth.clone();
        if let Some(userinfo) = url
            .split_once("://")
            .and_then(|(_, rest)| rest.split(['/', ',']).next())
            .and_then(|authority| authority.rsplit_once('@'))
            .map(|(userinfo, _)| userinfo.to_string())
        {
            let decode = |s: &str| {
                form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                    .next()
                    .map_or_else(|| s.to_string(), |(_, v)| v.into_owned())
            };
            match userinfo.split_once(':') {
                Some((user, password)) if auth.user.is_none() => {
                    auth.user = Some(decode(user));
                    auth.password = Some(decode(password));
                }
                None if auth.token.is_none() => auth.token = Some(decode(&userinfo)),
                _ => {}
            }
        }
        let url = &redacted(url);
        if let (Some(user), Some(password)) = (&auth.user, &auth.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &auth.token {
            options = options.token(token.clone());
        }
        if let Some(seed) = &auth.nkey_seed {
            options = options.nkey(seed.clone());
        }
        if let Some(path) = &auth.creds_file {
            options = options.credentials_file(path).await.map_err(|source| {
                ClusterError::Credentials {
                    path: path.clone(),
                    source,
                }
            })?;
        }
        if let Some(ca) = &auth.ca_file {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        tracing::info!(%url, "joining the cluster through NATS");
        let client = options
            .name(format!("stepstream-hub-{hub_id:016x}"))
            .event_callback(move |event| {
                let reconnected = reconnected.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            tracing::info!("connected to NATS");
                            let _ = reconnected.try_send(());
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!(
                                "lost NATS; other hubs' runs are read again once it is back"
                            )
                        }
                        other => tracing::debug!(event = %other, "NATS"),
                    }
                }
            })
            .connect(url)
            .await
            .map_err(|source| ClusterError::Connect {
                url: url.clone(),
                source,
            })?;
        let (outbox, mut queued) = mpsc::channel::<Vec<u8>>(OUTBOX);
        let sender = client.clone();
        tokio::spawn(async move {
            while let Some(frame) = queued.recv().await {
                if let Err(e) = sender.publish(SUBJECT, Bytes::from(frame)).await {
                    tracing::warn!(error = %e, "could not publish to the other hubs");
                }
            }
        });
        tracing::info!(hub = format!("{hub_id:016x}"), %url, "joined the cluster");
        let cluster = Arc::new(Cluster {
            hub_id,
            outbox,
            dropped: AtomicU64::new(0),
            client,
        });
        Ok((cluster, Reconnects(reconnects)))
    }

    /// Queues a message for the other hubs without waiting.
    pub fn publish(&self, msg: ToPeer) {
        if self.outbox.try_send(msg.encode()).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped = n,
                    "the NATS outbox is full; other hubs catch up from the store"
                );
            }
        }
    }

    /// The other hubs' messages, and word of each (re)connection, from now on.
    pub async fn inbox(&self, reconnects: Reconnects) -> Result<Inbox, ClusterError> {
        Ok(Inbox {
            messages: self.client.subscribe(SUBJECT).await?,
            reconnects,
        })
    }
}

/// What reaches a hub from its cluster.
pub enum Heard {
    /// A message another hub (or this one) published.
    Message(ToPeer),
    /// NATS (re)connected: messages may have been missed meanwhile.
    Reconnected,
}

/// The subscription to the cluster's subject, with the reconnections.
pub struct Inbox {
    messages: async_nats::Subscriber,
    reconnects: Reconnects,
}

impl Inbox {
    /// The next thing heard; `None` once the subscription ended. An undecodable message is
    /// logged and skipped.
    pub async fn next(&mut self) -> Option<Heard> {
        use futures_util::StreamExt;
        loop {
            tokio::select! {
                msg = self.messages.next() => {
                    match ToPeer::decode(&msg?.payload) {
                        Ok(peer) => return Some(Heard::Message(peer)),
                        Err(e) => tracing::warn!(error = %e, "an undecodable message from another hub"),
                    }
                }
                Some(()) = self.reconnects.0.recv() => return Some(Heard::Reconnected),
            }
        }
    }
}

/// Signals that NATS (re)connected.
pub struct Reconnects(mpsc::Receiver<()>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nats_url_is_logged_without_its_secrets() {
        assert_eq!(
            redacted("nats://hub:s3cret@nats.lab:4222"),
            "nats://nats.lab:4222"
        );
        assert_eq!(
            redacted("nats://t0ken@a:4222,nats://b:4222"),
            "nats://a:4222,nats://b:4222"
        );
        assert_eq!(redacted("tls://nats.lab"), "tls://nats.lab");
    }
}
