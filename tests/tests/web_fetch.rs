//! `web_fetch` against a real HTTP server on 127.0.0.1, called as a real
//! process of a real in-process kernel.
//!
//! The only server a test can run is on loopback, so the refusals run with
//! `allow_private_networks = false` and assert the server saw no request,
//! while the positive cases (and redirects out of the server into refused
//! places) run with it set to true. A redirect into loopback runs with the
//! page server alone allowed (`allow_addresses`) and a second server on
//! 127.0.0.2 as the target.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use hivekernel_agents::ProcessContext;
use hivekernel_agents::tools::web::{self, WebSettings};
use hivekernel_agents::tools::{ToolContext, ToolError, ToolRegistry};
use hivekernel_kernel::Kernel;
use hivekernel_tests::capture::captured_process;
use hivekernel_tests::web_server::{Page, WebServer};
use serde_json::{Value, json};

struct Fixture {
    kernel: Kernel,
    process: ProcessContext,
    server: WebServer,
}

async fn fixture(pages: Vec<(&str, Page)>) -> Fixture {
    let (kernel, process) = captured_process("agent").await;
    Fixture {
        process,
        kernel,
        server: WebServer::start(pages).await,
    }
}

/// Settings for tests: a 5 s deadline, and loopback open or closed.
fn settings(allow_private_networks: bool) -> WebSettings {
    WebSettings {
        allow_private_networks,
        timeout_seconds: 5,
        ..WebSettings::default()
    }
}

impl Fixture {
    async fn call(&self, settings: WebSettings, args: Value) -> Result<String, ToolError> {
        let mut tools = ToolRegistry::default();
        web::register(&mut tools, settings);
        let ctx = ToolContext {
            process: &self.process,
            workspace: None,
            checkpoint: None,
        };
        tools.get("web_fetch").unwrap().call(&ctx, args).await
    }

    /// Fetches `url` with loopback allowed; panics on refusal.
    async fn fetch(&self, url: &str) -> String {
        self.call(settings(true), json!({ "url": url }))
            .await
            .unwrap_or_else(|err| panic!("fetch {url}: {err}"))
    }

    /// Calls with `args` and returns the error, failing the test if it succeeded.
    async fn refused(&self, settings: WebSettings, args: Value) -> String {
        match self.call(settings, args.clone()).await {
            Ok(out) => panic!("web_fetch {args} succeeded: {out}"),
            Err(err) => err.0,
        }
    }

    async fn finish(self) {
        self.kernel.shutdown().await;
    }
}

const PAGE: &str = "<!DOCTYPE html>\n<html><head><title>Fish &amp; Chips</title>\
    <style>body { color: red }</style><script>var secretScript = 1;</script></head>\
    <body><h1>Menu</h1><p>Fish &amp; Chips &lt;today&gt; &#8364;5&nbsp;only</p>\
    <ul><li>Cod</li><li>Haddock &#x2014; fresh</li></ul>\
    <noscript>enable scripts</noscript><script>document.write('secretScript')</script>\
    <div>Open<br>daily</div></body></html>";

#[tokio::test]
async fn refused_urls_never_reach_the_server() {
    let fx = fixture(vec![("/", Page::html("<p>secret</p>"))]).await;
    let port = fx.server.port();
    let cases = [
        (
            format!("http://127.0.0.1:{port}/"),
            "address 127.0.0.1 is loopback",
        ),
        (format!("http://[::1]:{port}/"), "address ::1 is loopback"),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            "carrying IPv4 127.0.0.1) is loopback",
        ),
        (
            format!("http://2130706433:{port}/"),
            "address 127.0.0.1 is loopback",
        ),
        (
            format!("http://0x7f.1:{port}/"),
            "address 127.0.0.1 is loopback",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "address 169.254.169.254 is a cloud metadata endpoint",
        ),
        ("http://10.0.0.1/".to_owned(), "is private (RFC 1918)"),
        (
            format!("http://localhost:{port}/"),
            "localhost resolves only to addresses that may not be fetched",
        ),
        ("ftp://x".to_owned(), "scheme `ftp:` is not allowed"),
        (
            "file:///etc/passwd".to_owned(),
            "scheme `file:` is not allowed",
        ),
        (
            "data:text/plain,hi".to_owned(),
            "scheme `data:` is not allowed",
        ),
        (format!("http://user:pw@127.0.0.1:{port}/"), "credentials"),
    ];
    for (url, expected) in cases {
        let started = Instant::now();
        let err = fx.refused(settings(false), json!({ "url": url })).await;
        assert!(err.starts_with("refused: "), "{url}: {err}");
        assert!(err.contains(expected), "{url}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{url} took long"
        );
    }
    let err = fx
        .refused(settings(false), json!({ "url": "http://" }))
        .await;
    assert!(err.contains("not a valid URL"), "{err}");
    assert_eq!(fx.server.paths(), Vec::<String>::new());

    // The default registry carries the default settings: loopback refused.
    let tools = ToolRegistry::builtin();
    let ctx = ToolContext {
        process: &fx.process,
        workspace: None,
        checkpoint: None,
    };
    let err = tools
        .get("web_fetch")
        .unwrap()
        .call(&ctx, json!({ "url": fx.server.url("/") }));
    assert!(err.await.unwrap_err().0.contains("loopback"));
    assert_eq!(fx.server.paths(), Vec::<String>::new());
    fx.finish().await;
}

#[tokio::test]
async fn redirects_out_of_the_server_are_checked_per_hop() {
    let fx = fixture(vec![
        (
            "/to-metadata",
            Page::redirect("http://169.254.169.254/latest/meta-data/"),
        ),
        (
            "/to-mapped",
            Page::Redirect(307, "http://[::ffff:a9fe:a9fe]/".into()),
        ),
        (
            "/to-ftp",
            Page::Redirect(301, "ftp://example.com/file".into()),
        ),
        ("/to-file", Page::Redirect(308, "file:///etc/passwd".into())),
        ("/to-zero", Page::redirect("http://0.0.0.0/")),
    ])
    .await;
    for (path, target, why) in [
        (
            "/to-metadata",
            "http://169.254.169.254/latest/meta-data/",
            "cloud metadata",
        ),
        ("/to-mapped", "http://[::ffff:a9fe:a9fe]/", "cloud metadata"),
        ("/to-ftp", "ftp://example.com/file", "scheme `ftp:`"),
        ("/to-file", "file:///etc/passwd", "scheme `file:`"),
        ("/to-zero", "http://0.0.0.0/", "unspecified"),
    ] {
        let from = fx.server.url(path);
        let err = fx.refused(settings(true), json!({ "url": from })).await;
        let hop = format!("refused redirect from {from} to {target}");
        assert!(err.contains(&hop) && err.contains(why), "{path}: {err}");
    }
    assert_eq!(
        fx.server.paths(),
        [
            "/to-metadata",
            "/to-mapped",
            "/to-ftp",
            "/to-file",
            "/to-zero"
        ]
    );
    fx.finish().await;
}

#[tokio::test]
async fn html_is_reduced_to_readable_text() {
    let fx = fixture(vec![("/menu", Page::html(PAGE))]).await;
    let url = fx.server.url("/menu");
    let out = fx.fetch(&url).await;
    let expected = format!(
        "HTTP 200 {url}\nContent-Type: text/html; charset=utf-8\nTitle: Fish & Chips\n\n\
         Menu\n\nFish & Chips <today> €5 only\n\n- Cod\n- Haddock — fresh\nOpen\ndaily"
    );
    assert_eq!(out, expected);
    assert!(
        !out.contains("secretScript") && !out.contains("color"),
        "{out}"
    );
    assert!(
        fx.server.user_agent().unwrap().starts_with("hivekernel/"),
        "{:?}",
        fx.server.user_agent()
    );
    fx.finish().await;
}

#[tokio::test]
async fn text_json_and_sniffed_html_are_answered() {
    let fx = fixture(vec![
        (
            "/notes.txt",
            Page::ok("text/plain; charset=utf-8", "line one\n  line two\n"),
        ),
        ("/data", Page::ok("application/json", r#"{"a": [1, 2]}"#)),
        (
            "/plain-html",
            Page::ok("text/plain", "<html><body><p>x &amp; y</p>"),
        ),
        (
            "/untyped",
            Page::Body {
                status: 200,
                content_type: None,
                body: b"just text".to_vec(),
            },
        ),
        ("/empty", Page::ok("text/plain", "")),
    ])
    .await;
    let out = fx.fetch(&fx.server.url("/notes.txt")).await;
    assert!(out.ends_with("\n\nline one\n  line two"), "{out}");
    let out = fx.fetch(&fx.server.url("/data")).await;
    assert!(
        out.contains("Content-Type: application/json\n\n{\"a\": [1, 2]}"),
        "{out}"
    );
    let out = fx.fetch(&fx.server.url("/plain-html")).await;
    assert!(out.ends_with("\n\nx & y"), "{out}");
    let out = fx.fetch(&fx.server.url("/untyped")).await;
    assert!(out.contains("Content-Type: (none)\n\njust text"), "{out}");
    let out = fx.fetch(&fx.server.url("/empty")).await;
    assert!(out.ends_with("\n\n(empty body)"), "{out}");

    // A name resolving to loopback passes the resolver when private networks are allowed.
    let by_name = format!("http://localhost:{}/data", fx.server.port());
    assert!(
        fx.fetch(&by_name)
            .await
            .starts_with(&format!("HTTP 200 {by_name}"))
    );
    fx.finish().await;
}

#[tokio::test]
async fn non_text_content_is_refused() {
    let fx = fixture(vec![
        (
            "/cat.png",
            Page::ok("image/png", vec![0x89, b'P', b'N', b'G', 0, 0]),
        ),
        ("/blob", Page::ok("application/octet-stream", vec![0u8; 64])),
        (
            "/untyped-binary",
            Page::Body {
                status: 200,
                content_type: None,
                body: vec![1, 0, 2, 0],
            },
        ),
    ])
    .await;
    for (path, shown) in [
        ("/cat.png", "\"image/png\""),
        ("/blob", "\"application/octet-stream\""),
        ("/untyped-binary", "the body is binary"),
    ] {
        let url = fx.server.url(path);
        let err = fx.refused(settings(true), json!({ "url": url })).await;
        assert!(
            err.starts_with(&format!(
                "refused: {url} answered HTTP 200 with content type"
            )) && err.contains(shown)
                && err.contains("not text"),
            "{err}"
        );
    }
    fx.finish().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_truncated() {
    let fx = fixture(vec![("/big", Page::ok("text/plain", "a".repeat(100_000)))]).await;
    let url = fx.server.url("/big");
    let out = fx
        .call(settings(true), json!({ "url": url, "max_bytes": 1000 }))
        .await
        .unwrap();
    let note = "\n[truncated: stopped reading at 1000 bytes; the body is 100000 bytes]";
    assert!(
        out.ends_with(&format!("\n\n{}{note}", "a".repeat(1000))),
        "{out}"
    );

    // The configured limit caps whatever the call asks for.
    let capped = WebSettings {
        max_bytes: 500,
        ..settings(true)
    };
    let out = fx
        .call(capped, json!({ "url": url, "max_bytes": 1_000_000 }))
        .await
        .unwrap();
    assert!(
        out.ends_with("stopped reading at 500 bytes; the body is 100000 bytes]"),
        "{out}"
    );
    assert!(
        out.contains(&format!("\n\n{}\n[truncated", "a".repeat(500))),
        "{out}"
    );
    fx.finish().await;
}

#[tokio::test]
async fn a_stalled_server_times_out_within_the_limit() {
    let fx = fixture(vec![("/stall", Page::Stall)]).await;
    let url = fx.server.url("/stall");
    let started = Instant::now();
    let err = fx
        .refused(settings(true), json!({ "url": url, "timeout_seconds": 1 }))
        .await;
    assert_eq!(err, format!("timed out after 1s fetching {url}"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // The configured deadline caps a longer one asked for.
    let short = WebSettings {
        timeout_seconds: 1,
        ..settings(true)
    };
    let started = Instant::now();
    let err = fx
        .refused(short, json!({ "url": url, "timeout_seconds": 60 }))
        .await;
    assert_eq!(err, format!("timed out after 1s fetching {url}"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    fx.finish().await;
}

#[tokio::test]
async fn redirects_are_followed_up_to_the_cap() {
    let fx = fixture(vec![
        ("/r1", Page::Redirect(301, "/r2".into())),
        ("/r2", Page::Redirect(303, "menu?from=r2".into())),
        ("/menu", Page::html("<p>arrived</p>")),
        ("/loop", Page::redirect("/loop")),
    ])
    .await;
    let start = fx.server.url("/r1");
    let out = fx.fetch(&start).await;
    let end = fx.server.url("/menu?from=r2");
    assert!(
        out.starts_with(&format!("HTTP 200 {end}\n"))
            && out.contains(&format!("Redirected 2 time(s) from {start}\n"))
            && out.ends_with("\n\narrived"),
        "{out}"
    );

    let looping = WebSettings {
        max_redirects: 3,
        ..settings(true)
    };
    let url = fx.server.url("/loop");
    let err = fx.refused(looping, json!({ "url": url })).await;
    assert!(
        err.starts_with(&format!(
            "too many redirects: {url} still redirects after 3 hops"
        )),
        "{err}"
    );
    // The first request and three redirects: four requests to /loop.
    assert_eq!(
        fx.server.paths().iter().filter(|p| *p == "/loop").count(),
        4
    );
    fx.finish().await;
}

#[tokio::test]
async fn error_statuses_are_answers() {
    let fx = fixture(vec![(
        "/broken",
        Page::Body {
            status: 500,
            content_type: Some("text/html".into()),
            body: b"<h1>Internal error</h1>".to_vec(),
        },
    )])
    .await;
    let url = fx.server.url("/nowhere");
    let out = fx.fetch(&url).await;
    assert_eq!(
        out,
        format!("HTTP 404 {url}\nContent-Type: text/plain\n\nno page at /nowhere")
    );
    let url = fx.server.url("/broken");
    let out = fx.fetch(&url).await;
    assert!(out.starts_with(&format!("HTTP 500 {url}\n")) && out.ends_with("\n\nInternal error"));
    fx.finish().await;
}

#[tokio::test]
async fn bad_arguments_are_named() {
    let fx = fixture(Vec::new()).await;
    let url = fx.server.url("/");
    for (args, expected) in [
        (json!({}), "missing field `url`"),
        (json!({ "url": 5 }), "field `url` must be a string"),
        (
            json!({ "url": url, "max_bytes": 0 }),
            "field `max_bytes` must be at least 1",
        ),
        (
            json!({ "url": url, "timeout_seconds": "9" }),
            "field `timeout_seconds` must be",
        ),
        (
            json!({ "url": url, "timeout_seconds": 0 }),
            "field `timeout_seconds` must be at least 1",
        ),
        (
            json!({ "url": url, "method": "POST" }),
            "unknown field `method`",
        ),
        (json!({ "url": " " }), "field `url` is empty"),
    ] {
        let err = fx.refused(settings(true), args.clone()).await;
        assert!(
            err.starts_with("invalid arguments for web_fetch: ") && err.contains(expected),
            "{args}: {err}"
        );
    }
    assert_eq!(fx.server.paths(), Vec::<String>::new());
    fx.finish().await;
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let fx = fixture(Vec::new()).await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/");
    let err = fx.refused(settings(true), json!({ "url": url })).await;
    assert!(
        err.starts_with(&format!("cannot connect to {url}: ")) && err.contains("refused"),
        "{err}"
    );
    fx.finish().await;
}

#[tokio::test]
async fn a_redirect_from_an_allowed_server_into_loopback_is_refused() {
    // The allowed server is 127.0.0.1 alone (`allow_addresses`); the target,
    // on 127.0.0.2, is loopback like any other and must never be reached.
    let target = WebServer::start_on(
        [127, 0, 0, 2].into(),
        vec![("/secret", Page::html("<p>secret</p>"))],
    )
    .await;
    let b = target.port();
    let fx = fixture(vec![
        ("/page", Page::html("<p>allowed</p>")),
        (
            "/to-target",
            Page::redirect(&format!("http://127.0.0.2:{b}/secret")),
        ),
        (
            "/to-decimal",
            Page::Redirect(301, format!("http://2130706434:{b}/secret")),
        ),
        (
            "/to-mapped",
            Page::Redirect(307, format!("http://[::ffff:127.0.0.2]:{b}/secret")),
        ),
        (
            "/to-v6",
            Page::Redirect(308, format!("http://[::1]:{b}/secret")),
        ),
        ("/to-private", Page::redirect("http://10.0.0.1/")),
        (
            "/to-metadata",
            Page::redirect("http://169.254.169.254/latest/meta-data/"),
        ),
    ])
    .await;
    let allowed = WebSettings {
        allow_addresses: vec![[127, 0, 0, 1].into()],
        ..settings(false)
    };
    // The allow-list opens the allowed server...
    let url = fx.server.url("/page");
    let out = fx
        .call(allowed.clone(), json!({ "url": url }))
        .await
        .unwrap();
    assert!(out.starts_with(&format!("HTTP 200 {url}")), "{out}");
    // ...and nothing else: not the target directly, nor through a redirect.
    let direct = target.url("/secret");
    let err = fx.refused(allowed.clone(), json!({ "url": direct })).await;
    assert!(
        err.contains("refused: address 127.0.0.2 is loopback"),
        "{err}"
    );
    for (path, to, why) in [
        (
            "/to-target",
            format!("http://127.0.0.2:{b}/secret"),
            "address 127.0.0.2 is loopback",
        ),
        (
            "/to-decimal",
            format!("http://127.0.0.2:{b}/secret"),
            "address 127.0.0.2 is loopback",
        ),
        (
            "/to-mapped",
            format!("http://[::ffff:7f00:2]:{b}/secret"),
            "(carrying IPv4 127.0.0.2) is loopback",
        ),
        (
            "/to-v6",
            format!("http://[::1]:{b}/secret"),
            "address ::1 is loopback",
        ),
        ("/to-private", "http://10.0.0.1/".to_owned(), "private"),
        (
            "/to-metadata",
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "cloud metadata",
        ),
    ] {
        let from = fx.server.url(path);
        let err = fx.refused(allowed.clone(), json!({ "url": from })).await;
        let hop = format!("refused redirect from {from} to {to}: ");
        assert!(err.contains(&hop) && err.contains(why), "{path}: {err}");
    }
    assert_eq!(target.paths(), Vec::<String>::new());
    assert_eq!(
        fx.server.paths(),
        [
            "/page",
            "/to-target",
            "/to-decimal",
            "/to-mapped",
            "/to-v6",
            "/to-private",
            "/to-metadata"
        ]
    );
    fx.finish().await;
}
