//! Debian's nginx in front of hubs, as the sample configs put it.

use super::*;
use std::process::Stdio;

/// Debian's nginx on `port`, proxying HTTP and WebSockets to the `upstream` servers (an
/// nginx `upstream` block's lines, e.g. `server 127.0.0.1:7070;`) as
/// `docs/reverse-proxy.nginx.conf` and `docs/cluster/nginx.conf` do; a connection that
/// cannot reach one server is tried on the next. Killed on drop.
pub struct Nginx {
    child: std::process::Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// What nginx wrote to its access log so far.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn nginx(port: u16, upstream: &str) -> Nginx {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nginx is not installed: scripts/test installs Debian's `nginx` package");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // The sample config's own access-log format (it keeps query strings, and so tokens, out).
    let sample = include_str!("../../docs/reverse-proxy.nginx.conf");
    let log_format = sample
        .lines()
        .find(|l| l.starts_with("log_format "))
        .expect("docs/reverse-proxy.nginx.conf has its log_format");
    let conf = format!(
        "worker_processes 1;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n  {log_format}\n  access_log {d}/access.log stepstream_no_query;\n  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
           upstream hubs {{\n{upstream}\n  }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
               proxy_pass http://hubs;\n      proxy_next_upstream error timeout;\n\
               proxy_connect_timeout 2s;\n      proxy_http_version 1.1;\n\
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
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    Nginx {
        child,
        port,
        _dir: dir,
    }
}
