//! A loopback HTTP server serving fixed pages by path, for `web_fetch` tests.
//!
//! `GET <path>` is answered with the [`Page`] registered for the path (the
//! query is ignored); an unknown path gets a `404` in plain text. Every
//! request's path and `User-Agent` are recorded, so a test can assert that a
//! refused fetch never reached the server, and its method, `Authorization`
//! header and body too, for webhook tests. The server stops when dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// One page's answer.
#[derive(Debug, Clone)]
pub enum Page {
    /// A status, an optional `Content-Type` and a body.
    Body {
        /// The HTTP status.
        status: u16,
        /// The `Content-Type` header, if any.
        content_type: Option<String>,
        /// The body, sent as is.
        body: Vec<u8>,
    },
    /// A redirect: this status with this `Location`.
    Redirect(u16, String),
    /// Never answers (until the client gives up or the server stops).
    Stall,
}

impl Page {
    /// `200 OK` with `content_type` and `body`.
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Page::Body {
            status: 200,
            content_type: Some(content_type.to_owned()),
            body: body.into(),
        }
    }

    /// `200 OK`, HTML in UTF-8.
    pub fn html(body: &str) -> Self {
        Page::ok("text/html; charset=utf-8", body)
    }

    /// A `302 Found` to `location`.
    pub fn redirect(location: &str) -> Self {
        Page::Redirect(302, location.to_owned())
    }
}

/// What the server saw.
#[derive(Debug, Default)]
struct Seen {
    /// (path, user agent) per request, in arrival order.
    requests: Mutex<Vec<(String, Option<String>)>>,
    /// Every request whole, in arrival order.
    received: Mutex<Vec<Received>>,
}

/// One request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Its path.
    pub path: String,
    /// Its `Authorization` header, if any.
    pub authorization: Option<String>,
    /// Its body, as text.
    pub body: String,
}

/// A running loopback page server; stops when dropped.
#[derive(Debug)]
pub struct WebServer {
    addr: SocketAddr,
    seen: Arc<Seen>,
    task: JoinHandle<()>,
}

impl WebServer {
    /// Serves `pages`, each `(path, page)`, on 127.0.0.1.
    pub async fn start(pages: Vec<(&str, Page)>) -> WebServer {
        WebServer::start_on(std::net::Ipv4Addr::LOCALHOST.into(), pages).await
    }

    /// Serves `pages` on `ip` (another loopback address such as 127.0.0.2, say).
    pub async fn start_on(ip: std::net::IpAddr, pages: Vec<(&str, Page)>) -> WebServer {
        let listener = TcpListener::bind((ip, 0))
            .await
            .expect("bind the loopback web server");
        let addr = listener.local_addr().expect("loopback web server address");
        let pages: HashMap<String, Page> = pages
            .into_iter()
            .map(|(path, page)| (path.to_owned(), page))
            .collect();
        let seen = Arc::new(Seen::default());
        let task = tokio::spawn(accept(listener, Arc::new(pages), seen.clone()));
        WebServer { addr, seen, task }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The path of every request so far, in arrival order.
    pub fn paths(&self) -> Vec<String> {
        let requests = self.seen.requests.lock();
        requests.iter().map(|(path, _)| path.clone()).collect()
    }

    /// Every request so far, whole, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.seen.received.lock().clone()
    }

    /// The `User-Agent` of the latest request.
    pub fn user_agent(&self) -> Option<String> {
        self.seen
            .requests
            .lock()
            .last()
            .and_then(|(_, ua)| ua.clone())
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until aborted; dropping the set aborts every connection with it.
async fn accept(listener: TcpListener, pages: Arc<HashMap<String, Page>>, seen: Arc<Seen>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (pages, seen) = (pages.clone(), seen.clone());
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (pages, seen) = (pages.clone(), seen.clone());
                async move { Ok::<_, Infallible>(handle(&pages, &seen, request).await) }
            });
            // A client that hangs up (a timeout or truncation test) is not an error here.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

async fn handle(
    pages: &HashMap<String, Page>,
    seen: &Seen,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let user_agent = request
        .headers()
        .get(hyper::header::USER_AGENT)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    seen.requests.lock().push((path.clone(), user_agent));
    let method = request.method().to_string();
    let authorization = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let body = http_body_util::BodyExt::collect(request.into_body())
        .await
        .map(|body| String::from_utf8_lossy(&body.to_bytes()).into_owned())
        .unwrap_or_default();
    seen.received.lock().push(Received {
        method,
        path: path.clone(),
        authorization,
        body,
    });
    let page = pages.get(&path).cloned().unwrap_or_else(|| Page::Body {
        status: 404,
        content_type: Some("text/plain".to_owned()),
        body: format!("no page at {path}").into_bytes(),
    });
    let builder = Response::builder();
    let (builder, body) = match page {
        Page::Body {
            status,
            content_type,
            body,
        } => {
            let mut builder = builder.status(status);
            if let Some(content_type) = content_type {
                builder = builder.header(hyper::header::CONTENT_TYPE, content_type);
            }
            (builder, body)
        }
        Page::Redirect(status, location) => (
            builder
                .status(status)
                .header(hyper::header::LOCATION, location),
            Vec::new(),
        ),
        Page::Stall => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            (builder.status(StatusCode::GATEWAY_TIMEOUT), Vec::new())
        }
    };
    builder
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}
