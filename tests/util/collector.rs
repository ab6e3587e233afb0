//! A raw collector connection, for frames the library never would send, and the identity
//! and hello it starts with.

use super::*;

/// A raw collector connection, for sending frames the library never would.
pub struct RawCollector {
    rt: tokio::runtime::Runtime,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl RawCollector {
    pub fn connect(hub: &Hub) -> RawCollector {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = format!("ws://127.0.0.1:{}/ws/collector", hub.port);
        let (ws, _) = rt.block_on(tokio_tungstenite::connect_async(url)).unwrap();
        RawCollector { rt, ws }
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

    /// The next hub frame, or `None` when the hub closed the socket.
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
                    return Some(FromHub::decode(&b).expect("hub frames decode"))
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
