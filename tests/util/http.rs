//! HTTP to a hub: `ureq` for ordinary requests; a hand-written request for the tests that
//! must forge what a client sends (hosts, origins, upgrades, a query's exact bytes).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A GET through `ureq`, with a bearer token when given; any status is an answer.
pub fn http_get(addr: &str, path: &str, bearer: Option<&str>) -> Response {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .redirects(0)
        .build();
    let mut request = agent.get(&format!("http://{addr}{path}"));
    if let Some(token) = bearer {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let answer = match request.call() {
        Ok(answer) | Err(ureq::Error::Status(_, answer)) => answer,
        Err(e) => panic!("GET {path}: {e}"),
    };
    let headers = answer
        .headers_names()
        .into_iter()
        .filter_map(|name| {
            let value = answer.header(&name)?.to_string();
            Some((name.to_ascii_lowercase(), value))
        })
        .collect();
    let status = answer.status();
    let mut body = Vec::new();
    answer.into_reader().read_to_end(&mut body).unwrap();
    Response {
        status,
        headers,
        body,
    }
}

/// A request with a body (`POST` JSON, say), whatever its answer's status.
pub fn http_request_body(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .redirects(0)
        .build();
    let mut request = agent.request(method, &format!("http://{addr}{path}"));
    for (k, v) in headers {
        if !k.eq_ignore_ascii_case("content-length") {
            request = request.set(k, v);
        }
    }
    let answer = match request.send_bytes(body) {
        Ok(answer) | Err(ureq::Error::Status(_, answer)) => answer,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = answer.status();
    let mut out = Vec::new();
    answer.into_reader().read_to_end(&mut out).unwrap();
    Response {
        status,
        headers: Default::default(),
        body: out,
    }
}

/// One HTTP/1.1 request with `Connection: close` and these headers; decodes chunked bodies.
pub fn http_request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16)
                .unwrap();
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = out;
    }
    Response {
        status,
        headers,
        body,
    }
}

/// Parses the hub's CSV export into (header, rows).
pub fn parse_csv(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    (header, rows)
}

/// The status code of a GET with exactly these headers (a WebSocket upgrade when `upgrade`).
pub fn http_status(addr: &str, path: &str, headers: &[(&str, &str)], upgrade: bool) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if upgrade {
        req.push_str(
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        );
    } else {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// The steps of a `/api/runs/{id}/series` answer.
pub fn series_steps(series: &serde_json::Value) -> Vec<i64> {
    serde_json::from_value(series["steps"].clone()).unwrap()
}
