//! The hub behind a reverse proxy (Debian's nginx, as `docs/reverse-proxy.nginx.conf`
//! describes): collectors, the API and the viewer socket through it, the `Host` and
//! `Origin` checks still holding.

use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};

#[test]
fn collectors_viewers_and_the_api_work_through_nginx_and_the_checks_still_hold() {
    // nginx passes the browser's `Host` on, so the hub must know the proxy's name.
    let proxy_port = free_port();
    let hub = Hub::start(&["--allow-host", &format!("127.0.0.1:{proxy_port}")]);
    let proxy = nginx(proxy_port, &format!("server 127.0.0.1:{};", hub.port));
    let via = format!("127.0.0.1:{}", proxy.port);
    // A collector streams through the proxy.
    let run = Collector::start(Options::new(
        &format!("ws://{via}"),
        "proxied",
        "through-nginx",
    ))
    .unwrap();
    for step in 0..500 {
        run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    // The API and the viewer socket through it, from the proxy's own page.
    let host = ("Host", via.as_str());
    let own = format!("http://{via}");
    assert_eq!(http_status(&via, "/api/runs", &[host], false), 200);
    // The sample config's access log keeps the path, never the query (and its token).
    assert_eq!(
        http_status(&via, "/api/runs?token=secret-in-query", &[host], false),
        200
    );
    let log = wait_for("the access log", Duration::from_secs(5), || {
        Some(proxy.access_log()).filter(|l| l.contains("GET /api/runs HTTP"))
    });
    assert!(!log.contains("secret-in-query"), "{log}");
    assert_eq!(
        http_status(&via, "/ws/viewer", &[host, ("Origin", &own)], true),
        101
    );
    assert_eq!(
        http_status(
            &via,
            "/ws/viewer",
            &[host, ("Origin", "http://evil.example")],
            true
        ),
        403
    );
    assert_eq!(
        http_status(&via, "/api/runs", &[("Host", "evil.example")], false),
        403
    );
    let mut viewer = Viewer::connect_url(format!("ws://{via}/ws/viewer"));
    assert!(viewer.pump(Duration::from_secs(5), |v| !v.run_list.is_empty()));
    let id = viewer.run_list[0].run_id.clone();
    viewer.subscribe(std::slice::from_ref(&id), None);
    assert!(viewer.pump(Duration::from_secs(10), |v| v
        .runs
        .get(&id)
        .is_some_and(|s| s.count("loss") == 500)));
}
