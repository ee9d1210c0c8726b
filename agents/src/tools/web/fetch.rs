//! One fetch: redirects followed by hand with every hop checked, the body
//! read up to the cap, and the answer rendered by content type.

use std::error::Error as StdError;
use std::fmt::Write as _;

use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Client, Response, StatusCode, Url};

use super::guard::{Reach, ResolveError, redirect_target};
use super::html;
use crate::tools::ToolError;

/// What one fetch may do.
#[derive(Debug, Clone)]
pub(super) struct Limits {
    /// Most body bytes read.
    pub(super) max_bytes: usize,
    /// Most redirects followed.
    pub(super) max_redirects: u32,
    /// Which internal addresses may be reached (for redirect targets).
    pub(super) reach: Reach,
}

/// A final response with its body read up to the cap.
#[derive(Debug)]
pub(super) struct Page {
    status: StatusCode,
    start: Url,
    url: Url,
    redirects: u32,
    content_type: Option<String>,
    kind: Kind,
    body: Vec<u8>,
    /// Whether the body went on past the cap.
    truncated: bool,
    /// The length the server declared, if it did.
    declared: Option<u64>,
}

/// How a content type becomes text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// HTML, reduced to text.
    Html,
    /// Text shown as is.
    Text,
    /// `text/plain`: HTML if it starts like HTML, else as is.
    Plain,
    /// No content type: refused if it looks binary, else like `Plain`.
    Undeclared,
    /// Not text; refused before the body is read.
    Binary,
}

impl Kind {
    fn of(content_type: Option<&str>) -> Kind {
        let Some(content_type) = content_type else {
            return Kind::Undeclared;
        };
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match mime.as_str() {
            "text/html" | "application/xhtml+xml" => Kind::Html,
            "text/plain" => Kind::Plain,
            "" => Kind::Undeclared,
            "application/json"
            | "application/xml"
            | "application/javascript"
            | "application/ecmascript"
            | "application/x-javascript"
            | "application/yaml"
            | "application/x-yaml"
            | "application/toml"
            | "application/x-sh"
            | "application/sql"
            | "application/graphql"
            | "application/x-www-form-urlencoded" => Kind::Text,
            m if m.starts_with("text/")
                || m.ends_with("+json")
                || m.ends_with("+xml")
                || m.ends_with("+yaml") =>
            {
                Kind::Text
            }
            _ => Kind::Binary,
        }
    }
}

/// Fetches `start` under `limits`, following redirects itself.
pub(super) async fn fetch(client: &Client, start: &Url, limits: Limits) -> Result<Page, ToolError> {
    let mut url = start.clone();
    let mut redirects = 0;
    loop {
        let response = client
            .get(url.clone())
            .send()
            .await
            .map_err(|err| send_failed(&url, redirects, &err))?;
        let status = response.status();
        if is_redirect(status)
            && let Some(location) = response.headers().get(LOCATION)
        {
            let location = location.to_str().map_err(|_| {
                ToolError::new(format!(
                    "{url} answered HTTP {} with a Location header that is not ASCII text",
                    status.as_u16()
                ))
            })?;
            if redirects >= limits.max_redirects {
                return Err(ToolError::new(format!(
                    "too many redirects: {start} still redirects after {redirects} hops \
                     (the limit is {}); the next hop was {location:?}",
                    limits.max_redirects
                )));
            }
            url = redirect_target(&url, location, &limits.reach).map_err(ToolError::new)?;
            redirects += 1;
            continue;
        }
        return read(response, start, url, redirects, limits.max_bytes).await;
    }
}

/// Whether `status` is a redirect to follow (300 and 304 are answers).
fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Reads the final response's body, refusing non-text content before it.
async fn read(
    mut response: Response,
    start: &Url,
    url: Url,
    redirects: u32,
    max_bytes: usize,
) -> Result<Page, ToolError> {
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).trim().to_owned())
        .filter(|value| !value.is_empty());
    let kind = Kind::of(content_type.as_deref());
    if kind == Kind::Binary {
        return Err(not_text(
            status,
            &url,
            content_type.as_deref().unwrap_or(""),
        ));
    }
    let declared = response.content_length();
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| ToolError::new(format!("reading the body of {url}: {}", chain(&err))))?
    {
        let room = max_bytes.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Page {
        status,
        start: start.clone(),
        url,
        redirects,
        content_type,
        kind,
        body,
        truncated,
        declared,
    })
}

impl Page {
    /// The answer for the model: `HTTP <status> <url>`, the content type,
    /// then the text, then a note if the body was cut.
    pub(super) fn render(&self) -> Result<String, ToolError> {
        let text = String::from_utf8_lossy(&self.body);
        let is_html = match self.kind {
            Kind::Html => true,
            Kind::Text => false,
            Kind::Plain => looks_like_html(&text),
            Kind::Undeclared if self.body.iter().take(1024).any(|&b| b == 0) => {
                return Err(not_text(
                    self.status,
                    &self.url,
                    "none, and the body is binary",
                ));
            }
            Kind::Undeclared => looks_like_html(&text),
            Kind::Binary => return Err(not_text(self.status, &self.url, "")),
        };
        let mut answer = format!(
            "HTTP {} {}\nContent-Type: {}\n",
            self.status.as_u16(),
            self.url,
            self.content_type.as_deref().unwrap_or("(none)")
        );
        if self.redirects > 0 {
            let _ = writeln!(
                answer,
                "Redirected {} time(s) from {}",
                self.redirects, self.start
            );
        }
        let body = if is_html {
            if let Some(title) = html::title(&text) {
                let _ = writeln!(answer, "Title: {title}");
            }
            html::to_text(&text)
        } else {
            text.trim_end().to_owned()
        };
        answer.push('\n');
        answer.push_str(if body.trim().is_empty() {
            "(empty body)"
        } else {
            &body
        });
        if self.truncated {
            let total = match self.declared {
                Some(total) => format!("the body is {total} bytes"),
                None => "the body is longer".to_owned(),
            };
            let _ = write!(
                answer,
                "\n[truncated: stopped reading at {} bytes; {total}]",
                self.body.len()
            );
        }
        Ok(answer)
    }
}

/// Whether text declared plain (or not declared) is really an HTML page.
fn looks_like_html(text: &str) -> bool {
    let head: String = text
        .chars()
        .take(1024)
        .collect::<String>()
        .to_ascii_lowercase();
    let head = head.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    head.starts_with("<!doctype html") || head.contains("<html")
}

/// The refusal of a body that is not text.
fn not_text(status: StatusCode, url: &Url, content_type: &str) -> ToolError {
    ToolError::new(format!(
        "refused: {url} answered HTTP {} with content type {content_type:?}, which is not text; \
         web_fetch reads HTML, plain text, JSON, XML and other text formats only",
        status.as_u16()
    ))
}

/// A failed request, named by hop; a refusal by the resolver is shown as is.
fn send_failed(url: &Url, redirects: u32, err: &reqwest::Error) -> ToolError {
    let why = match resolve_error(err) {
        Some(resolve) => resolve.to_string(),
        None if err.is_connect() => format!("cannot connect to {url}: {}", chain(err)),
        None => format!("request to {url} failed: {}", chain(err)),
    };
    if redirects > 0 {
        ToolError::new(format!("redirect {redirects} to {url}: {why}"))
    } else {
        ToolError::new(why)
    }
}

/// The resolver's own error, if it is what failed the request.
fn resolve_error(err: &reqwest::Error) -> Option<&ResolveError> {
    let mut source = err.source();
    while let Some(err) = source {
        if let Some(found) = err.downcast_ref::<ResolveError>() {
            return Some(found);
        }
        source = err.source();
    }
    None
}

/// What caused `err`, each cause said once; reqwest's own text only repeats
/// the URL, so it is used only when there is no cause.
fn chain(err: &reqwest::Error) -> String {
    let Some(first) = err.source() else {
        return err.to_string();
    };
    let mut text = first.to_string();
    let mut source = first.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_map_to_kinds() {
        for (content_type, kind) in [
            (Some("text/html; charset=utf-8"), Kind::Html),
            (Some("TEXT/HTML"), Kind::Html),
            (Some("application/xhtml+xml"), Kind::Html),
            (Some("text/plain"), Kind::Plain),
            (Some("text/csv"), Kind::Text),
            (Some("application/json"), Kind::Text),
            (Some("application/ld+json"), Kind::Text),
            (Some("application/atom+xml"), Kind::Text),
            (None, Kind::Undeclared),
            (Some("image/png"), Kind::Binary),
            (Some("application/octet-stream"), Kind::Binary),
            (Some("application/pdf"), Kind::Binary),
            (Some("video/mp4"), Kind::Binary),
        ] {
            assert_eq!(Kind::of(content_type), kind, "{content_type:?}");
        }
    }

    #[test]
    fn html_is_sniffed() {
        assert!(looks_like_html("\u{feff}\n  <!DOCTYPE html><p>x"));
        assert!(looks_like_html("<?xml version=\"1.0\"?>\n<HTML><body>x"));
        assert!(!looks_like_html("plain text mentioning html"));
    }
}
