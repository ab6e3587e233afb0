//! The hub behind a reverse proxy (Debian's nginx, as `docs/reverse-proxy.nginx.conf`
//! describes): collectors, the API and the viewer socket through it, the `Host` and
//! `Origin` checks still holding.

use crate::util::*;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};

struct Nginx {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx on `port`, proxying to a hub on `hub_port` as the documented config does.
fn nginx(hub_port: u16, port: u16) -> Nginx {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nginx is not installed: scripts/test installs Debian's `nginx` package");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let conf = format!(
        "worker_processes 1;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
               proxy_pass http://127.0.0.1:{hub_port};\n      proxy_http_version 1.1;\n\
               proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection $connection_upgrade;\n\
               proxy_set_header Host $http_host;\n      proxy_buffering off;\n\
               proxy_read_timeout 1h;\n      client_max_body_size 17m;\n    }}\n  }}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let child = Command::new(bin)
        .args([
            "-p",
            &d.to_string(),
            "-c",
            "nginx.conf",
            "-g",
            "daemon off;",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_for("nginx", Duration::from_secs(10), || {
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
    Nginx {
        child,
        port,
        _dir: dir,
    }
}

#[test]
fn collectors_viewers_and_the_api_work_through_nginx_and_the_checks_still_hold() {
    // nginx passes the browser's `Host` on, so the hub must know the proxy's name.
    let proxy_port = free_port();
    let hub = Hub::start(&["--allow-host", &format!("127.0.0.1:{proxy_port}")]);
    let proxy = nginx(hub.port, proxy_port);
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
