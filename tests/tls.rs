//! TLS served by the hub: `wss://` from the Rust collector with a private CA, HTTPS for the
//! API, and a renewed certificate picked up without a restart.

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};

/// A private CA and a server certificate for 127.0.0.1 signed by it, in `dir`, made with the
/// openssl CLI: `(ca.pem, cert.pem, key.pem)`.
pub fn pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=stepstream test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    )
}

/// Streams one run over `wss://` trusting `ca`; whether every record was acknowledged.
fn stream(hub: &Hub, ca: Option<&Path>, name: &str) -> bool {
    let mut o = Options::new(&format!("wss://127.0.0.1:{}", hub.port), "tls", name);
    o.ca_file = ca.map(Path::to_path_buf);
    let run = Collector::start(o).unwrap();
    for step in 0..100 {
        run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
    }
    run.finish_shared(Outcome::Finished, Duration::from_secs(3))
        .delivered
}

/// `curl` over HTTPS trusting `ca`: the body, or `None` when TLS fails.
fn curl(hub: &Hub, ca: &Path, path: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "5", "--cacert"])
        .arg(ca)
        .arg(format!("https://127.0.0.1:{}{path}", hub.port))
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn wss_with_a_private_ca_and_a_certificate_renewed_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(&dir.path().join("first"));
    let served_cert = dir.path().join("hub-cert.pem");
    let served_key = dir.path().join("hub-key.pem");
    std::fs::copy(&cert, &served_cert).unwrap();
    std::fs::copy(&key, &served_key).unwrap();
    let hub = Hub::start(&[
        "--tls-cert",
        served_cert.to_str().unwrap(),
        "--tls-key",
        served_key.to_str().unwrap(),
    ]);
    assert!(
        stream(&hub, Some(&ca), "trusted"),
        "wss:// with the private CA"
    );
    assert!(
        !stream(&hub, None, "untrusted"),
        "an unknown CA is not trusted"
    );
    let runs = curl(&hub, &ca, "/api/runs").expect("HTTPS with the CA");
    assert!(
        runs.contains("\"trusted\"") && !runs.contains("\"untrusted\""),
        "{runs}"
    );

    // A renewal (another CA here, to tell them apart): picked up while serving.
    let (ca2, cert2, key2) = pki(&dir.path().join("second"));
    std::fs::copy(&key2, &served_key).unwrap();
    std::fs::copy(&cert2, &served_cert).unwrap();
    wait_for("the renewed certificate", Duration::from_secs(15), || {
        curl(&hub, &ca2, "/api/health")
    });
    assert!(
        curl(&hub, &ca, "/api/health").is_none(),
        "the old certificate is gone"
    );
    assert!(stream(&hub, Some(&ca2), "after-renewal"));
    let runs = curl(&hub, &ca2, "/api/runs").unwrap();
    assert!(
        runs.contains("\"trusted\"") && runs.contains("\"after-renewal\""),
        "nothing lost: {runs}"
    );
}

/// The commands that call the hub's HTTP API (`export`, `delete`; `stop`, `checkpoint` and
/// `note` share their client) reach an HTTPS hub whose certificate a private CA signed when
/// given `--ca-file`, and refuse it without.
#[test]
fn the_api_commands_trust_a_private_ca_given_with_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let hub = Hub::start(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let mut o = Options::new(&format!("wss://127.0.0.1:{}", hub.port), "tls", "exported");
    o.ca_file = Some(ca.clone());
    o.run_id = Some(stepstream_protocol::RunId::new("tls-exported").unwrap());
    let run = Collector::start(o).unwrap();
    for step in 0..100 {
        run.log(step, &[("loss", 1.0 / (1.0 + step as f64))]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    let hub_url = format!("https://127.0.0.1:{}", hub.port);
    let out = dir.path().join("out");
    let export = |ca_file: Option<&Path>| {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "export",
            "tls-exported",
            "--format",
            "csv",
            "--hub",
            &hub_url,
        ])
        .arg("--out")
        .arg(&out)
        .env_remove("STEPSTREAM_CA_FILE");
        if let Some(ca) = ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        cmd.output().unwrap()
    };
    let refused = export(None);
    assert!(!refused.status.success(), "an unknown CA is not trusted");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("cannot reach the hub"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let done = export(Some(&ca));
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let csv = std::fs::read_to_string(out.join("tls-exported.csv")).unwrap();
    assert_eq!(csv.lines().count(), 101, "a header and every step");

    let delete = |ca_file: Option<&Path>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["delete", "tls-exported", "--hub", &hub_url])
            .env_remove("STEPSTREAM_CA_FILE");
        if let Some(ca) = ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        cmd.output().unwrap()
    };
    assert!(!delete(None).status.success());
    assert!(curl(&hub, &ca, "/api/runs")
        .unwrap()
        .contains("tls-exported"));
    let deleted = delete(Some(&ca));
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    assert!(!curl(&hub, &ca, "/api/runs")
        .unwrap()
        .contains("tls-exported"));
}
