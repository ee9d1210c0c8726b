//! The page and its script and style, built into the binary: nothing is
//! fetched at run time and nothing but cargo is needed to build them.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    pub path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// Every file served without a session.
pub const ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/index.html"),
    },
    Asset {
        path: "/assets/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        path: "/assets/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/app.css"),
    },
];

impl Asset {
    /// Its entity tag: a digest of its bytes.
    pub fn etag(&self) -> HeaderValue {
        let etag = format!("\"{}\"", &hex(&Sha256::digest(self.body))[..16]);
        HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\""))
    }

    /// The file, or 304 when the browser's copy (`If-None-Match`) is the
    /// one `etag` names.
    pub fn serve(&self, etag: HeaderValue, request: &HeaderMap) -> Response {
        let cached = request
            .get(header::IF_NONE_MATCH)
            .is_some_and(|given| given == etag);
        // Revalidated on every load, so a new binary's files are seen at once.
        let headers = [
            (header::ETAG, etag),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ];
        if cached {
            return (StatusCode::NOT_MODIFIED, headers).into_response();
        }
        (
            headers,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(self.content_type),
            )],
            self.body,
        )
            .into_response()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
