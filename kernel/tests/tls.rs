//! TLS and mutual TLS on the control plane, end to end: `hivekernel start`
//! with certificates made at test time (a CA, a server and a client
//! certificate it signed, and an unrelated CA with a client certificate of
//! its own), driven by the CLI exactly as a user would drive it.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::support::{CONFIG, Kernel, Run, binary, write_config};

/// PEM files made for one test, in `<dir>/pki`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
    other_client_cert: PathBuf,
    other_client_key: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        let write = |name: &str, text: String| {
            let path = pki.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let (ca_pem, ca) = authority("HiveKernel test CA");
        let (other_pem, other) = authority("Unrelated CA");
        let server_names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let (server_cert, server_key) =
            leaf(&ca, server_names, ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf(&ca, vec![], ExtendedKeyUsagePurpose::ClientAuth);
        let (other_cert, other_key) = leaf(&other, vec![], ExtendedKeyUsagePurpose::ClientAuth);
        Pki {
            ca: write("ca.pem", ca_pem),
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            other_ca: write("other-ca.pem", other_pem),
            other_client_cert: write("other-client.pem", other_cert),
            other_client_key: write("other-client.key", other_key),
        }
    }

    /// `--tls-cert` and `--tls-key` of the server, and `--tls-ca` naming the CA.
    fn server_flags(&self) -> Vec<String> {
        flags(&[
            ("--tls-cert", &self.server_cert),
            ("--tls-key", &self.server_key),
            ("--tls-ca", &self.ca),
        ])
    }
}

/// A self-signed CA: its certificate (PEM) and what signs with it.
fn authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// A certificate signed by `issuer` and its key (PEM).
fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
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

fn flags(pairs: &[(&str, &Path)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()])
        .collect()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// A kernel with [`CONFIG`] and `extra` start arguments, its certificates in `<dir>/pki`.
fn start(extra: impl FnOnce(&Pki) -> Vec<String>) -> (Kernel, Pki) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let config = write_config(dir.path(), CONFIG);
    let extra = extra(&pki);
    (Kernel::start_with(dir, &config, &strs(&extra)), pki)
}

/// Names of the processes `ps --json` lists.
fn names(run: &Run) -> Vec<String> {
    let procs = run.json();
    let procs = procs.as_array().unwrap();
    procs
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `hivekernel start` that is expected to refuse: its run, or a failure if
/// it is still running after 20 s (it started instead).
fn start_refused(dir: &Path, extra: &[&str]) -> Run {
    let config = write_config(dir, CONFIG);
    let mut child = Command::new(binary())
        .arg("start")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(extra)
        .env_remove("HIVEKERNEL_DATA_DIR")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("hivekernel start {extra:?} did not refuse: still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert!(
        !dir.join("data").exists(),
        "a refused start created its data directory: {run:#?}"
    );
    run
}

/// The one `error:` line of a failed client run, after checking it is one line.
fn one_error_line(run: &Run, code: i32) -> String {
    let stderr = run.failed(code);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{run:#?}");
    assert!(!stderr.contains("panicked"), "{run:#?}");
    lines[0].to_owned()
}

#[test]
fn ps_over_tls_trusts_the_ca_given_or_the_one_the_kernel_wrote() {
    let (kernel, pki) = start(Pki::server_flags);
    assert!(
        kernel.addr.starts_with("https://127.0.0.1:"),
        "{}",
        kernel.addr
    );
    let ca = pki.ca.to_str().unwrap();
    let listed = names(&kernel.cli(&["ps", "--json", "--tls-ca", ca]));
    assert!(listed.contains(&"queen".to_owned()), "{listed:?}");

    // Without --tls-ca the CLI trusts what the kernel wrote: the --tls-ca it was started with.
    let written = std::fs::read(kernel.data_dir().join("tls-ca.pem")).unwrap();
    assert_eq!(written, std::fs::read(&pki.ca).unwrap());
    assert_eq!(names(&kernel.cli(&["ps", "--json"])), listed);
    // A bare host:port with a CA is https.
    let bare = kernel.addr.trim_start_matches("https://");
    let run = crate::support::hivekernel_with(
        &[
            "ps",
            "--json",
            "--addr",
            bare,
            "--tls-ca",
            ca,
            "--data-dir",
            "/nonexistent",
        ],
        &[("HIVEKERNEL_TOKEN", &kernel.token())],
    );
    assert_eq!(names(&run), listed);
}

#[test]
fn a_plain_text_client_cannot_talk_to_a_tls_kernel() {
    let (kernel, _pki) = start(Pki::server_flags);
    let plain = kernel.addr.replace("https://", "http://");
    let run = crate::support::hivekernel_with(
        &["ps", "--addr", &plain, "--data-dir", "/nonexistent"],
        &[("HIVEKERNEL_TOKEN", &kernel.token())],
    );
    let line = one_error_line(&run, 3);
    assert!(line.contains(&plain), "{line}");
    assert!(line.contains("if the kernel serves TLS"), "{line}");
}

#[test]
fn a_client_trusting_another_ca_is_refused() {
    let (kernel, pki) = start(Pki::server_flags);
    let run = kernel.cli(&["ps", "--tls-ca", pki.other_ca.to_str().unwrap()]);
    let line = one_error_line(&run, 3);
    assert!(line.contains("--tls-ca"), "{line}");
    assert!(line.contains("not trusted"), "{line}");
}

#[test]
fn tls_settings_with_a_plain_text_address_are_refused() {
    let kernel = Kernel::start();
    assert!(kernel.addr.starts_with("http://"), "{}", kernel.addr);
    let ca = kernel.dir.path().join("ca.pem");
    let run = kernel.cli(&["ps", "--tls-ca", ca.to_str().unwrap()]);
    let line = one_error_line(&run, 2);
    assert!(
        line.contains("plain text") && line.contains("https://"),
        "{line}"
    );
}

#[test]
fn mutual_tls_accepts_only_clients_with_a_certificate_from_the_client_ca() {
    let (kernel, pki) = start(|pki| {
        let mut extra = pki.server_flags();
        extra.extend(flags(&[("--tls-client-ca", &pki.ca)]));
        extra
    });
    assert!(
        kernel.log().contains("client certificates required"),
        "{}",
        kernel.log()
    );

    let without = kernel.cli(&["ps"]);
    let line = one_error_line(&without, 3);
    assert!(line.contains("requires client certificates"), "{line}");

    let other = flags(&[
        ("--tls-cert", &pki.other_client_cert),
        ("--tls-key", &pki.other_client_key),
    ]);
    let mut args = vec!["ps"];
    args.extend(strs(&other));
    one_error_line(&kernel.cli(&args), 3);

    let good = flags(&[
        ("--tls-cert", &pki.client_cert),
        ("--tls-key", &pki.client_key),
    ]);
    let mut args = vec!["ps", "--json"];
    args.extend(strs(&good));
    assert!(names(&kernel.cli(&args)).contains(&"helper".to_owned()));

    // Half a client identity is a usage error, before any connection.
    let run = kernel.cli(&["ps", "--tls-cert", pki.client_cert.to_str().unwrap()]);
    let line = one_error_line(&run, 2);
    assert!(line.contains("--tls-key"), "{line}");
}

#[test]
fn a_non_loopback_listen_needs_tls_or_insecure_remote() {
    let dir = tempfile::tempdir().unwrap();
    let run = start_refused(dir.path(), &["--listen", "0.0.0.0:0"]);
    let stderr = run.failed(2);
    for needed in ["0.0.0.0:0", "--insecure-remote", "--tls-cert", "--tls-key"] {
        assert!(stderr.contains(needed), "no {needed}: {stderr}");
    }
}

#[test]
fn with_tls_a_non_loopback_listen_starts_and_answers_on_loopback() {
    let (kernel, pki) = start(|pki| {
        let mut extra = pki.server_flags();
        extra.extend(["--listen".to_owned(), "0.0.0.0:0".to_owned()]);
        extra
    });
    // The address file names loopback, which the certificate covers; 0.0.0.0 it never would.
    assert!(
        kernel.addr.starts_with("https://127.0.0.1:"),
        "{}",
        kernel.addr
    );
    assert!(
        !kernel.log().contains("--insecure-remote"),
        "{}",
        kernel.log()
    );
    let ca = pki.ca.to_str().unwrap();
    assert!(names(&kernel.cli(&["ps", "--json", "--tls-ca", ca])).contains(&"queen".to_owned()));
}

#[test]
fn bad_tls_files_are_refused_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let junk = dir.path().join("pki/junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.path().join("pki/missing.pem");
    let refused = |given: &[(&str, &Path)], file: &Path, problem: &str| {
        let extra = flags(given);
        let case = tempfile::tempdir().unwrap();
        let run = start_refused(case.path(), &strs(&extra));
        let stderr = run.failed(2);
        assert!(
            stderr.contains(file.to_str().unwrap()) && stderr.contains(problem),
            "{given:?}: expected {problem} naming {file:?}: {run:#?}"
        );
    };
    let (cert, key) = (pki.server_cert.as_path(), pki.server_key.as_path());
    refused(
        &[("--tls-cert", &missing), ("--tls-key", key)],
        &missing,
        "cannot read TLS certificate",
    );
    refused(
        &[("--tls-cert", &junk), ("--tls-key", key)],
        &junk,
        "no certificate in it",
    );
    refused(
        &[("--tls-cert", cert), ("--tls-key", &junk)],
        &junk,
        "no private key in it",
    );
    // The client's key is a real key, of another certificate.
    refused(
        &[("--tls-cert", cert), ("--tls-key", &pki.client_key)],
        &pki.client_key,
        "cannot be used with the certificate",
    );
    refused(
        &[
            ("--tls-cert", cert),
            ("--tls-key", key),
            ("--tls-client-ca", &junk),
        ],
        &junk,
        "TLS client CA",
    );

    let half = [
        (vec![("--tls-cert", pki.server_cert.as_path())], "--tls-key"),
        (vec![("--tls-key", pki.server_key.as_path())], "--tls-cert"),
        (vec![("--tls-client-ca", pki.ca.as_path())], "--tls-cert"),
    ];
    for (given, needed) in half {
        let extra = flags(&given);
        let case = tempfile::tempdir().unwrap();
        let run = start_refused(case.path(), &strs(&extra));
        assert!(run.failed(2).contains(needed), "{given:?}: {run:#?}");
    }
}

#[test]
fn the_config_tls_section_serves_tls_with_paths_relative_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let config = CONFIG.replacen(
        r#""kernel": {"#,
        r#""kernel": { "tls": { "cert": "pki/server.pem", "key": "pki/server.key", "ca": "pki/ca.pem" },"#,
        1,
    );
    let path = write_config(dir.path(), &config);
    let check = crate::support::hivekernel(&["config", "check", path.to_str().unwrap()]);
    check.ok();
    let kernel = Kernel::start_with(dir, &path, &[]);
    assert!(kernel.addr.starts_with("https://"), "{}", kernel.addr);
    let ca = pki.ca.to_str().unwrap();
    assert!(names(&kernel.cli(&["ps", "--json", "--tls-ca", ca])).contains(&"queen".to_owned()));

    // Half a pair in the config is an issue at its location.
    let other = tempfile::tempdir().unwrap();
    let broken = write_config(
        other.path(),
        r#"{ "kernel": { "tls": { "cert": "server.pem", "client_ca": "" } } }"#,
    );
    let run = crate::support::hivekernel(&["config", "check", broken.to_str().unwrap()]);
    let stderr = run.failed(2);
    assert!(stderr.contains("kernel.tls.key: missing"), "{stderr}");
    assert!(
        stderr.contains("kernel.tls.client_ca: must not be empty"),
        "{stderr}"
    );
}

#[test]
fn an_exec_agent_reaches_a_tls_kernel_with_the_ca_it_is_given() {
    let (kernel, _pki) = start(Pki::server_flags);
    // The agent runs the CLI itself: HIVEKERNEL_ADDR (host:port), HIVEKERNEL_TOKEN
    // and HIVEKERNEL_TLS_CA are all it gets, and all it needs.
    let script = format!(
        "echo \"ca=$HIVEKERNEL_TLS_CA\" >&2; exec {} ps --json --root \"$HIVEKERNEL_PID\"",
        binary().display()
    );
    let data = kernel.data_dir();
    let run = crate::support::hivekernel(&[
        "spawn",
        "--parent",
        "1",
        "--name",
        "tls-agent",
        "--addr",
        &kernel.addr,
        "--data-dir",
        data.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let pid = run.ok().trim().to_owned();
    let exit = kernel
        .cli(&["wait", &pid, "--json", "--timeout", "20"])
        .json();
    let log = kernel.data_dir().join(format!("logs/{pid}-tls-agent.log"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(exit["exit_code"], 0, "{exit}\n{text}");
    let ca = std::path::absolute(kernel.data_dir().join("tls-ca.pem")).unwrap();
    assert!(text.contains(&format!("ca={}", ca.display())), "{text}");
    assert!(text.contains("\"tls-agent\""), "{text}");
}

/// One HTTP/1.0 request over TLS to `addr`, trusting `ca` (and presenting
/// `client` when given): the status line, the headers and the body; an
/// error when the handshake fails.
fn https(
    addr: &str,
    ca: &Path,
    client: Option<(&Path, &Path)>,
    request: &str,
) -> std::io::Result<String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::io::{Read, Write};
    use std::sync::Arc;

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let socket = std::net::TcpStream::connect(addr)?;
    socket.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut stream = rustls::StreamOwned::new(connection, socket);
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => {}
        // HTTP/1.0: the server may close without a TLS close_notify.
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(err) => return Err(err),
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// `host:port` of the dashboard the kernel announced, with its scheme.
fn dashboard_url(kernel: &Kernel) -> String {
    let file = kernel.data_dir().join("dashboard.url");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(url) = std::fs::read_to_string(&file) {
            return url.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no dashboard.url:\n{}",
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_dashboard_is_served_over_tls_with_the_control_planes_certificate() {
    let (kernel, pki) = start(Pki::server_flags);
    let url = dashboard_url(&kernel);
    let addr = url
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("{url}"))
        .trim_end_matches('/')
        .to_owned();
    let page = https(
        &addr,
        &pki.ca,
        None,
        &format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n"),
    )
    .unwrap();
    assert!(page.starts_with("HTTP/1.0 200"), "{page}");
    assert!(page.contains("<html"), "{page}");
    // Logged in over TLS, the session cookie is Secure.
    let body = format!("{{\"token\": \"{}\"}}", kernel.token());
    let login = https(
        &addr,
        &pki.ca,
        None,
        &format!(
            "POST /api/login HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .unwrap();
    let cookie = login
        .lines()
        .find(|line| line.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("{login}"));
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    // A client that trusts another CA gets no page, and plain HTTP no answer.
    assert!(https(&addr, &pki.other_ca, None, "GET / HTTP/1.0\r\n\r\n").is_err());
    let plain = {
        use std::io::{Read, Write};
        let mut socket = std::net::TcpStream::connect(&addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        socket.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer);
        answer
    };
    assert!(!String::from_utf8_lossy(&plain).contains("<html"));
}

#[test]
fn under_mutual_tls_the_dashboard_needs_a_client_certificate_too() {
    let (kernel, pki) = start(|pki| {
        let mut flags = pki.server_flags();
        flags.extend(["--tls-client-ca".to_owned(), pki.ca.display().to_string()]);
        flags
    });
    let url = dashboard_url(&kernel);
    let addr = url.trim_start_matches("https://").trim_end_matches('/');
    let get = format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    assert!(https(addr, &pki.ca, None, &get).is_err());
    let other = (
        pki.other_client_cert.as_path(),
        pki.other_client_key.as_path(),
    );
    assert!(https(addr, &pki.ca, Some(other), &get).is_err());
    let client = (pki.client_cert.as_path(), pki.client_key.as_path());
    let page = https(addr, &pki.ca, Some(client), &get).unwrap();
    assert!(page.starts_with("HTTP/1.0 200"), "{page}");
}
