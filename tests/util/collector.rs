//! A raw collector connection, for frames the library never would send, and the identity
//! and hello it starts with.

use super::*;

/// A raw collector connection, for sending frames the library never would.
pub struct RawCollector {
    rt: tokio::runtime::Runtime,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    /// The last linger the hub asked for (in `Welcome`, then `Pace`, which
    /// [`RawCollector::recv`] passes over).
    pub pace: Option<u32>,
}

impl RawCollector {
    pub fn connect(hub: &Hub) -> RawCollector {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = format!("ws://127.0.0.1:{}/ws/collector", hub.port);
        let (ws, _) = rt.block_on(tokio_tungstenite::connect_async(url)).unwrap();
        RawCollector { rt, ws, pace: None }
    }

    pub fn send_bytes(&mut self, bytes: Vec<u8>) {
        use futures_util::SinkExt;
        let frame = tokio_tungstenite::tungstenite::Message::Binary(bytes.into());
        // The hub may already have closed after a fatal error; that is fine here.
        let _ = self.rt.block_on(self.ws.send(frame));
    }

    pub fn send(&mut self, msg: ToHub) {
        self.send_bytes(msg.encode());
    }

    /// Reads the hub's frames (passing over the rest) until the linger it asks for satisfies
    /// `want`; `None` if it did not within `limit`.
    pub fn await_pace(&mut self, limit: Duration, want: impl Fn(u32) -> bool) -> Option<u32> {
        use futures_util::StreamExt;
        let until = std::time::Instant::now() + limit;
        loop {
            if let Some(p) = self.pace.filter(|&p| want(p)) {
                return Some(p);
            }
            let left = until.checked_duration_since(std::time::Instant::now())?;
            let ws = &mut self.ws;
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(left, ws.next()).await })
                .ok()??;
            if let Ok(tokio_tungstenite::tungstenite::Message::Binary(b)) = next {
                if let Ok(FromHub::Pace(p)) = FromHub::decode(&b) {
                    self.pace = Some(p.linger_ms);
                }
            }
        }
    }

    /// The next hub frame but a `Pace` (kept in [`RawCollector::pace`]), or `None` when the
    /// hub closed the socket.
    pub fn recv(&mut self) -> Option<FromHub> {
        use futures_util::StreamExt;
        loop {
            let ws = &mut self.ws;
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), ws.next()).await })
                .expect("hub answers within 10 s")?;
            match next {
                Ok(tokio_tungstenite::tungstenite::Message::Binary(b)) => {
                    match FromHub::decode(&b).expect("hub frames decode") {
                        FromHub::Pace(p) => self.pace = Some(p.linger_ms),
                        FromHub::Welcome(w) => {
                            self.pace = Some(w.linger_ms);
                            return Some(FromHub::Welcome(w));
                        }
                        msg => return Some(msg),
                    }
                }
                Ok(tokio_tungstenite::tungstenite::Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }
}

pub fn identity(run_id: &str, name: &str) -> RunIdentity {
    RunIdentity {
        run_id: RunId::new(run_id).unwrap(),
        project: "tests".into(),
        name: name.into(),
        config_json: "{}".into(),
        host: "test".into(),
        rank: 0,
        world_size: 1,
        job: String::new(),
        framework: String::new(),
        started_at: unix_now(),
    }
}

pub fn hello(run_id: &str, token: Option<&str>) -> ToHub {
    ToHub::Hello(Hello {
        protocol: codec::VERSION,
        token: token.map(String::from),
        run: identity(run_id, run_id),
        writer: 7,
        acked_through: 0,
    })
}
