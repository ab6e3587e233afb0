//! The page's one viewer socket, for whoever sends on it (the state's subscriptions, the
//! zoom windows): it is opened by the app, kept here.

use std::cell::RefCell;
use stepstream_chart::ws;
use stepstream_protocol::FromViewer;

thread_local! {
    static SOCKET: RefCell<Option<ws::Socket>> = const { RefCell::new(None) };
}

pub fn set(s: ws::Socket) {
    SOCKET.with(|slot| *slot.borrow_mut() = Some(s));
}

/// Sends on the socket (dropped while it is not open: what is wanted is sent again on
/// the next open).
pub fn send(msg: FromViewer) {
    SOCKET.with(|s| {
        if let Some(s) = s.borrow().as_ref() {
            s.send(&msg);
        }
    });
}
