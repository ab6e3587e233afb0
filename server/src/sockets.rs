//! Counting connections, in one place: the hub-wide cap on open connections (taken by the
//! accept loop), WebSockets per client address (taken after authentication), collector
//! sockets awaiting their hello and the bytes they sent, and the open-socket gauges
//! `/metrics` shows. Each count is a guard held by its connection and given back on drop.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// Every count of the hub's connections.
pub struct Sockets {
    /// Open connections, HTTP and WebSocket (`--limit connections`).
    pub open: Arc<Semaphore>,
    /// Collector sockets awaiting their hello (`--limit pending_hellos`).
    pub pending_hellos: Arc<Semaphore>,
    /// Bytes all sockets awaiting their hello may have sent (`--limit prehello_bytes`).
    pub prehello_bytes: Arc<Semaphore>,
    /// Open WebSockets per client address, at most `per_addr_limit` each.
    per_addr: Mutex<HashMap<IpAddr, usize>>,
    per_addr_limit: usize,
    /// Reverse proxies whose `X-Forwarded-For` names the client (`--trusted-proxy`).
    trusted_proxies: Vec<IpAddr>,
    /// Open collector and viewer sockets, for the gauges.
    pub collectors: AtomicU64,
    pub viewers: AtomicU64,
}

impl Sockets {
    pub fn new(limits: &crate::limits::HubLimits, trusted_proxies: Vec<IpAddr>) -> Sockets {
        Sockets {
            open: Arc::new(Semaphore::new(limits.connections)),
            pending_hellos: Arc::new(Semaphore::new(limits.pending_hellos)),
            prehello_bytes: Arc::new(Semaphore::new(limits.prehello_bytes)),
            per_addr: Mutex::default(),
            per_addr_limit: limits.connections_per_addr,
            trusted_proxies,
            collectors: AtomicU64::new(0),
            viewers: AtomicU64::new(0),
        }
    }

    /// The address a connection's limits key on: the peer's, or, when the peer is a trusted
    /// reverse proxy (`--trusted-proxy`), the client it names last in `X-Forwarded-For` (the
    /// entry that proxy wrote; earlier ones are whatever the client claimed). Without the
    /// trust, a forwarded address is ignored: anyone could claim any address.
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusted_proxies.contains(&peer) {
            return peer;
        }
        // Only the last entry: the one the trusted proxy wrote. An unreadable one is not
        // replaced by an earlier, client-written one.
        headers
            .get_all("x-forwarded-for")
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .and_then(|a| a.trim().parse::<IpAddr>().ok())
            .unwrap_or(peer)
    }

    /// A WebSocket slot for the client at `addr`, or the refusal that names the limit.
    pub fn slot(self: &Arc<Self>, addr: IpAddr) -> Result<Slot, TooMany> {
        let limit = self.per_addr_limit;
        let mut open = self.per_addr.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(addr).or_default();
        if *n >= limit {
            tracing::warn!(%addr, limit, "connection refused: too many from one address");
            return Err(TooMany { addr, limit });
        }
        *n += 1;
        Ok(Slot {
            owner: self.clone(),
            addr,
        })
    }
}

/// One open WebSocket of a client address, counted until dropped.
pub struct Slot {
    owner: Arc<Sockets>,
    addr: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .owner
            .per_addr
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

/// A WebSocket refused because its address has too many open.
#[derive(Debug)]
pub struct TooMany {
    addr: IpAddr,
    limit: usize,
}

impl std::fmt::Display for TooMany {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} already has {} open connections to this hub (limit connections_per_addr)",
            self.addr, self.limit
        )
    }
}

impl IntoResponse for TooMany {
    fn into_response(self) -> Response {
        (StatusCode::TOO_MANY_REQUESTS, format!("{self}\n")).into_response()
    }
}

/// Counts one open socket in a gauge until dropped.
pub struct Open<'a>(&'a AtomicU64);

impl<'a> Open<'a> {
    pub fn new(counter: &'a AtomicU64) -> Open<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Open(counter)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_per_address_and_freed() {
        let limits = crate::limits::HubLimits {
            connections_per_addr: 2,
            ..Default::default()
        };
        let c = Arc::new(Sockets::new(&limits, Vec::new()));
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let s1 = c.slot(a).unwrap();
        let _s2 = c.slot(a).unwrap();
        assert!(c.slot(a).is_err());
        assert!(c.slot(b).is_ok());
        drop(s1);
        assert!(c.slot(a).is_ok());
    }

    #[test]
    fn a_forwarded_address_counts_only_from_a_trusted_proxy() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let c = Sockets::new(&Default::default(), vec![proxy]);
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "6.6.6.6, 192.0.2.7".parse().unwrap());
        assert_eq!(
            c.client_addr(proxy, &h),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        let stranger: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(c.client_addr(stranger, &h), stranger);
    }
}
