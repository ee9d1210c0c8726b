//! The dashboard against someone who holds the operator's session cookie
//! but not the page: a process on another port of the same host, which a
//! browser hands the cookie to (cookies ignore ports). Each case runs the
//! real binary; the browser case runs Debian's Chromium.

use std::time::Duration;

use hivekernel_tests::binary::Binary;
use hivekernel_tests::dashboard::{self, Session, login, request};
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use serde_json::json;

fn binary() -> std::path::PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

fn admin_token(kernel: &Binary) -> String {
    std::fs::read_to_string(kernel.dir.join("data/admin.token"))
        .unwrap()
        .trim()
        .to_owned()
}

async fn start(dir: &std::path::Path) -> (Binary, LlmServer) {
    let server = LlmServer::answering(|_| Scripted::content("ok")).await;
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 }
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    (Binary::start(&binary(), dir), server)
}

/// The operator tokens the kernel holds, by name.
fn token_names(kernel: &Binary) -> Vec<String> {
    kernel
        .json(&["token", "ls", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|token| token["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

const MINT: &str = r#"{"name":"stolen","scope":"TOKEN_SCOPE_ADMIN"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_alone_mints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, _server) = start(dir.path()).await;
    let addr = dashboard::address(&kernel);
    let operator = login(&addr, &admin_token(&kernel)).unwrap();
    let cookie = operator.cookie.as_str();

    // What a process that was handed the cookie tries, as curl would.
    let session = request(&addr, "GET", "/api/session", &[("Cookie", cookie)], "").unwrap();
    assert_eq!(session.status, 401, "{session:?}");
    assert!(!session.body.contains(&operator.csrf), "{session:?}");
    assert!(session.body.contains("X-CSRF-Token"), "{session:?}");
    let json = ("Content-Type", "application/json");
    for path in ["/api/rpc/CreateToken", "/api/ticket", "/api/logout"] {
        let refused = request(&addr, "POST", path, &[("Cookie", cookie), json], MINT).unwrap();
        assert_eq!(refused.status, 401, "{path}: {refused:?}");
        let wrong = "0".repeat(operator.csrf.len());
        let guessed = request(
            &addr,
            "POST",
            path,
            &[("Cookie", cookie), json, ("X-CSRF-Token", &wrong)],
            MINT,
        )
        .unwrap();
        assert_eq!(guessed.status, 401, "{path}: {guessed:?}");
    }
    // A live stream needs a ticket: not none, not the key, not one used.
    let mut bare = operator.watch_with("SubscribeEvents", &json!({}), "");
    bare.next(Duration::from_secs(5));
    assert_eq!(bare.status, Some(401));
    let mut keyed = operator.watch_with("SubscribeEvents", &json!({}), &operator.csrf);
    keyed.next(Duration::from_secs(5));
    assert_eq!(keyed.status, Some(401));
    let ticket = operator.ticket();
    let mut first = operator.watch_with("SubscribeEvents", &json!({}), &ticket);
    first.next(Duration::from_secs(5));
    assert_eq!(first.status, Some(200));
    let mut again = operator.watch_with("SubscribeEvents", &json!({}), &ticket);
    again.next(Duration::from_secs(5));
    assert_eq!(again.status, Some(401));
    // A ticket is no key.
    let mut as_key = operator.clone();
    as_key.csrf = operator.ticket();
    assert_eq!(as_key.get("/api/session").status, 401);

    // A page elsewhere: another host name (DNS rebinding), another port of
    // this host, another site.
    let key = operator.csrf.as_str();
    let rebound = request(
        &addr,
        "GET",
        "/api/session",
        &[
            ("Host", "attacker.example"),
            ("Cookie", cookie),
            ("X-CSRF-Token", key),
        ],
        "",
    )
    .unwrap();
    assert_eq!(rebound.status, 403, "{rebound:?}");
    assert!(
        rebound.body.contains("kernel.dashboard.hosts"),
        "{rebound:?}"
    );
    let page = request(&addr, "GET", "/", &[("Host", "attacker.example:80")], "").unwrap();
    assert_eq!(page.status, 403, "{page:?}");
    for extra in [
        ("Origin", "http://127.0.0.1:52997"),
        ("Origin", "null"),
        ("Sec-Fetch-Site", "same-site"),
        ("Sec-Fetch-Site", "cross-site"),
    ] {
        let cross = request(
            &addr,
            "POST",
            "/api/rpc/CreateToken",
            &[("Cookie", cookie), json, ("X-CSRF-Token", key), extra],
            MINT,
        )
        .unwrap();
        assert_eq!(cross.status, 403, "{extra:?}: {cross:?}");
    }
    assert!(!token_names(&kernel).contains(&"stolen".to_owned()));

    // The page itself still may.
    let minted = operator.post(
        "/api/rpc/CreateToken",
        &json!({ "name": "minted", "scope": "TOKEN_SCOPE_READ" }),
        &[
            ("Origin", &format!("http://{addr}")),
            ("Sec-Fetch-Site", "same-origin"),
        ],
    );
    assert_eq!(minted.status, 200, "{minted:?}");
    assert_eq!(token_names(&kernel), vec!["minted".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_with_another_token_do_not_end_the_operators_session() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, _server) = start(dir.path()).await;
    let addr = dashboard::address(&kernel);
    let operator = login(&addr, &admin_token(&kernel)).unwrap();
    let viewer = kernel.json(&[
        "token", "create", "--scope", "read", "--name", "viewer", "--json",
    ]);
    let viewer = viewer["token"].as_str().unwrap().to_owned();
    let mut first: Option<Session> = None;
    for _ in 0..300 {
        let session = login(&addr, &viewer).unwrap();
        first.get_or_insert(session);
    }
    assert_eq!(operator.get("/api/session").status, 200);
    // The viewer's own oldest session made room for its newer ones.
    assert_eq!(first.unwrap().get("/api/session").status, 401);
}

/// The attack in a browser: the operator, logged in to the dashboard,
/// opens a link to a page a local process serves on another port. The
/// browser hands that process the session cookie; neither the page's
/// script nor the process can reach the dashboard's API with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_port_cannot_use_the_operators_session() {
    let playwright = dashboard::playwright();
    let chromium = dashboard::chromium();
    let dir = tempfile::tempdir().unwrap();
    let (kernel, _server) = start(dir.path()).await;
    let addr = dashboard::address(&kernel);
    let shots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("browser/stolen-cookie.mjs");
    let run = tokio::task::spawn_blocking({
        let admin = admin_token(&kernel);
        move || {
            std::process::Command::new("node")
                .arg(script)
                .env("DASHBOARD_URL", format!("http://{addr}/"))
                .env("ADMIN_TOKEN", admin)
                .env("SHOTS", shots)
                .env("CHROMIUM", chromium)
                .env("PLAYWRIGHT", playwright)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{stdout}\n{stderr}\n--- kernel log ---\n{}",
        kernel.log()
    );
    assert!(
        stdout.contains("ok   the stolen cookie mints nothing"),
        "{stdout}"
    );
    assert!(
        token_names(&kernel).is_empty(),
        "{:?}",
        token_names(&kernel)
    );
}
