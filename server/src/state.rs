//! What every request handler shares: the hub, the live tokens, the socket counts.

use crate::{auth, hub::Hub, sockets};
use std::sync::Arc;

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub hub: Arc<Hub>,
    pub auth: Arc<auth::LiveAuth>,
    /// The allowed origins as a `frame-ancestors` source list tail (` https://wiki.example`):
    /// who may frame `/embed`.
    pub frame_ancestors: Arc<str>,
    /// Every count of open connections.
    pub sockets: Arc<sockets::Sockets>,
}
