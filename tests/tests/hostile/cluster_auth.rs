//! Who may join a cluster's NATS: a node signs in (a password or a token
//! in its server URLs, an nkey seed, a TLS client certificate) against a
//! real `nats-server` that requires it, a wrong secret is refused without
//! being quoted, a server that lets a node without credentials in is
//! refused unless the network was declared trusted (`--insecure-cluster`),
//! and `config check` names each bad setting.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hivekernel_kernel::cluster::{Cluster, ClusterError};
use hivekernel_kernel::config::ClusterSettings;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::nats::{Access, NatsCluster, USER};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{Value, json};

fn binary() -> PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

/// A config whose `kernel.cluster` is `cluster`, no agents.
fn config(cluster: Value) -> String {
    json!({
        "kernel": {
            "listen": "127.0.0.1:0",
            "shutdown_grace_ms": 0,
            "dashboard": { "enabled": false },
            "cluster": cluster
        },
        "agents": []
    })
    .to_string()
}

/// `dir/config.json` holding `config`, `dir` made first.
fn write_config(dir: &Path, config: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, config).unwrap();
    path
}

/// `hivekernel start` of `config` in `dir` with `extra`, expected to fail:
/// its exit code (`None` if it still ran after 30 s, and was killed) and
/// stderr.
fn start_fails(bin: &Path, dir: &Path, config: &str, extra: &[&str]) -> (Option<i32>, String) {
    let path = write_config(dir, config);
    let log = dir.join("start.log");
    let mut child = Command::new(bin)
        .arg("start")
        .arg(path)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

/// `hivekernel config check` of `config` in `dir`: exit code, stdout and stderr.
fn config_check(bin: &Path, dir: &Path, config: &str) -> (Option<i32>, String) {
    let path = write_config(dir, config);
    let out = Command::new(bin)
        .args(["config", "check"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The node `name` started from `config` in `dir`, and the names of the
/// nodes it sees.
fn joined(bin: &Path, dir: &Path, config: &str, extra: &[&str]) -> (Binary, Vec<String>) {
    write_config(dir, config);
    let node = Binary::start_with(bin, dir, extra);
    let nodes = node.json(&["nodes", "--json"]);
    let names = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect();
    (node, names)
}

/// Writes `text` to `dir/name` with `mode`.
fn secret_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// Joins in-process as node `name` with `settings`, then leaves.
async fn join_and_leave(settings: ClusterSettings) -> Result<(), ClusterError> {
    let cluster = Cluster::join(settings, "127.0.0.1:1".into(), 0, 1_000).await?;
    cluster.leave().await;
    Ok(())
}

#[test]
fn a_node_signs_in_with_the_password_in_its_url_and_a_wrong_one_is_refused_unquoted() {
    let bin = binary();
    let nats = NatsCluster::start_with(1, Access::Password);
    let root = tempfile::tempdir().unwrap();
    let timing = json!({ "servers": [nats.url(0)], "heartbeat_ms": 200, "node_ttl_ms": 1_500 });
    let (node, names) = joined(
        &bin,
        &root.path().join("a"),
        &config(timing),
        &["--node", "a"],
    );
    assert_eq!(names, ["a"], "{}", node.log());
    assert!(!node.log().contains(nats.secret()), "{}", node.log());

    let wrong = format!("nats://{USER}:wrong-pa55word@{}", nats.addr(0));
    let (code, stderr) = start_fails(
        &bin,
        &root.path().join("b"),
        &config(json!({ "servers": [wrong], "node": "b" })),
        &[],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("authorization violation")
            && stderr.contains("refused this node's credentials")
            && stderr.contains(&format!("nats://{USER}:***@{}", nats.addr(0))),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-pa55word"), "{stderr}");
    // `--cluster` carries it the same way, and `config check` says it too.
    let (code, stderr) = start_fails(
        &bin,
        &root.path().join("c"),
        &config(json!({ "servers": ["nats://127.0.0.1:1"] })),
        &[
            "--cluster",
            &format!("{wrong},{}", nats.url(0)),
            "--node",
            "c",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("other credentials than server [0]") && !stderr.contains("pa55word"),
        "{stderr}"
    );
    let (code, text) = config_check(
        &bin,
        &root.path().join("d"),
        &config(json!({ "servers": [wrong], "node": "d" })),
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("kernel.cluster.servers: cannot reach NATS")
            && text.contains("authorization violation")
            && !text.contains("pa55word"),
        "{text}"
    );
}

#[test]
fn a_node_signs_in_with_the_token_in_its_url() {
    let nats = NatsCluster::start_with(1, Access::Token);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(
        nats.url(0),
        format!("nats://{}@{}", nats.secret(), nats.addr(0))
    );
    let settings = ClusterSettings::new(vec![nats.url(0)], "a".into());
    rt.block_on(join_and_leave(settings)).unwrap();

    let wrong = format!("nats://not-the-t0ken@{}", nats.addr(0));
    let err = rt
        .block_on(join_and_leave(ClusterSettings::new(
            vec![wrong],
            "b".into(),
        )))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("authorization violation")
            && err.contains(&format!("nats://***@{}", nats.addr(0))),
        "{err}"
    );
    assert!(!err.contains("not-the-t0ken"), "{err}");
}

#[test]
fn a_node_signs_in_with_an_nkey_seed_file_beside_its_config() {
    let bin = binary();
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let nats = NatsCluster::start_with(1, Access::Nkeys(vec![user.public_key()]));
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    std::fs::create_dir_all(dir.join("nats")).unwrap();
    secret_file(&dir.join("nats"), "node.nk", &user.seed().unwrap(), 0o600);
    let cluster = json!({ "servers": [nats.url(0)], "node": "a", "nkey_file": "nats/node.nk" });
    let (node, names) = joined(&bin, &dir, &config(cluster), &[]);
    assert_eq!(names, ["a"], "{}", node.log());

    // Another user's seed is refused, and neither seed is ever shown.
    let dir = root.path().join("b");
    std::fs::create_dir_all(&dir).unwrap();
    let seed = stranger.seed().unwrap();
    secret_file(&dir, "node.nk", &seed, 0o600);
    let cluster = json!({ "servers": [nats.url(0)], "node": "b", "nkey_file": "node.nk" });
    let (code, stderr) = start_fails(&bin, &dir, &config(cluster), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("authorization violation"), "{stderr}");
    assert!(!stderr.contains(&seed), "{stderr}");
}

/// A CA's certificate (PEM) and what signs with it.
fn authority() -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "nats test CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// A certificate `issuer` signs for `names` and `usage`, and its key (PEM).
fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "hivekernel test");
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[test]
fn a_node_signs_in_with_a_client_certificate_over_tls() {
    let pki = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| secret_file(pki.path(), name, text, 0o600);
    let (ca_pem, ca) = authority();
    let ca_file = write("ca.pem", &ca_pem);
    let (cert, key) = leaf(&ca, &["127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
    let server = Access::Tls {
        cert: write("server.pem", &cert),
        key: write("server.key", &key),
        ca: ca_file.clone(),
    };
    let (cert, key) = leaf(&ca, &["node-a"], ExtendedKeyUsagePurpose::ClientAuth);
    let (client_cert, client_key) = (write("client.pem", &cert), write("client.key", &key));
    let nats = NatsCluster::start_with(1, server);
    assert!(nats.url(0).starts_with("tls://"), "{}", nats.url(0));
    let rt = tokio::runtime::Runtime::new().unwrap();

    let mut settings = ClusterSettings::new(vec![nats.url(0)], "a".into());
    settings.tls_ca = Some(ca_file.clone());
    settings.tls_cert = Some(client_cert);
    settings.tls_key = Some(client_key);
    assert!(settings.has_credentials());
    rt.block_on(join_and_leave(settings)).unwrap();

    // Without a client certificate the server refuses the handshake.
    let mut settings = ClusterSettings::new(vec![nats.url(0)], "b".into());
    settings.tls_ca = Some(ca_file);
    let err = rt.block_on(join_and_leave(settings)).unwrap_err();
    assert!(matches!(err, ClusterError::Connect { .. }), "{err}");
}

#[test]
fn a_node_without_credentials_joins_an_open_server_only_when_told_the_network_is_trusted() {
    let bin = binary();
    let nats = NatsCluster::start_with(1, Access::Open);
    let root = tempfile::tempdir().unwrap();
    let cluster = json!({ "servers": [nats.url(0)], "heartbeat_ms": 200, "node_ttl_ms": 1_500 });
    let (code, stderr) = start_fails(
        &bin,
        &root.path().join("a"),
        &config(cluster.clone()),
        &["--node", "a"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("let this node in without credentials")
            && stderr.contains("--insecure-cluster")
            && stderr.contains("kernel.cluster.insecure")
            && stderr.contains("kernel.cluster.nkey_file"),
        "{stderr}"
    );
    assert!(!root.path().join("a/data/kernel.addr").exists());
    let (code, text) = config_check(&bin, &root.path().join("a"), &config(cluster.clone()));
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("kernel.cluster: NATS at") && text.contains("--insecure-cluster"),
        "{text}"
    );

    let (a, names) = joined(
        &bin,
        &root.path().join("a"),
        &config(cluster.clone()),
        &["--node", "a", "--insecure-cluster"],
    );
    assert_eq!(names, ["a"]);
    assert!(
        a.log().contains("joining NATS without credentials"),
        "{}",
        a.log()
    );
    let mut trusted = cluster;
    trusted["insecure"] = json!(true);
    let (b, names) = joined(
        &bin,
        &root.path().join("b"),
        &config(trusted),
        &["--node", "b"],
    );
    assert_eq!(names[0], "b", "this node first: {names:?}");
    assert!(b.log().contains("--insecure-cluster"), "{}", b.log());
}

#[test]
fn config_check_names_each_bad_way_to_sign_in() {
    let bin = binary();
    let dir = tempfile::tempdir().unwrap();
    secret_file(
        dir.path(),
        "open.nk",
        &nkeys::KeyPair::new_user().seed().unwrap(),
        0o644,
    );
    secret_file(
        dir.path(),
        "node.nk",
        &nkeys::KeyPair::new_user().seed().unwrap(),
        0o600,
    );
    let (code, text) = config_check(
        &bin,
        dir.path(),
        &config(json!({
            "servers": ["nats://127.0.0.1:4222"], "node": "a",
            "creds_file": "missing.creds", "nkey_file": "open.nk", "tls_cert": "client.pem"
        })),
    );
    assert_eq!(code, Some(2), "{text}");
    for expected in [
        "kernel.cluster.creds_file: cannot read credentials file",
        "kernel.cluster.nkey_file: cannot read nkey seed file",
        "mode 644",
        "kernel.cluster.tls_key: missing",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    let (code, text) = config_check(
        &bin,
        dir.path(),
        &config(json!({
            "servers": ["nats://alice:s3cret@127.0.0.1:4222"], "node": "a", "nkey_file": "node.nk",
            "tls_ca": "ca.pem"
        })),
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains(
            "kernel.cluster.nkey_file: is set beside credentials in kernel.cluster.servers"
        ) && text.contains("kernel.cluster.tls_ca: cannot read NATS TLS CA"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
    std::fs::write(dir.path().join("junk.creds"), "not a creds file").unwrap();
    std::fs::set_permissions(
        dir.path().join("junk.creds"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (code, text) = config_check(
        &bin,
        dir.path(),
        &config(json!({
            "servers": ["nats://127.0.0.1:4222"], "node": "a",
            "creds_file": "junk.creds", "nkey_file": "node.nk"
        })),
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("kernel.cluster.creds_file:")
            && text.contains("is not a NATS credentials file")
            && text.contains("kernel.cluster.nkey_file: is set beside creds_file"),
        "{text}"
    );
}
