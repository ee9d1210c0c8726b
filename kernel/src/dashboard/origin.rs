//! Which requests the dashboard answers, by where they say they come from.
//!
//! - `Host` must name the dashboard: an IP address, `localhost` (or a name
//!   under `.localhost`), or a name in `kernel.dashboard.hosts`. A page on
//!   a name of its own that resolves to the dashboard's address (DNS
//!   rebinding) is refused before anything is served.
//! - An API call must come from the page itself: a browser that names the
//!   request's origin (`Origin`) must name the dashboard's own (scheme and
//!   `Host`), and one that says where the call was made from
//!   (`Sec-Fetch-Site`) must say `same-origin`, or `none` for an address
//!   typed by hand. A page on another port of the same host is `same-site`
//!   to the browser, never `same-origin`: it is refused.
//!
//! Clients other than browsers (curl, scripts) send neither header and
//! are judged by their session alone ([`super::session`]).

use std::net::IpAddr;

use axum::http::{HeaderMap, header};

/// Why a request is refused; `None` when it may go on.
pub(super) fn refusal(headers: &HeaderMap, api: bool, hosts: &[String]) -> Option<String> {
    let Some(host) = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
    else {
        return Some("the request names no Host".to_owned());
    };
    let name = host_name(host);
    if !known(name, hosts) {
        return Some(format!(
            "this dashboard does not answer to the host {}: use its IP address or \
             localhost, or list the name in kernel.dashboard.hosts",
            hivekernel_agents::text::shown(name)
        ));
    }
    if !api {
        return None;
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or_default();
        if site != "same-origin" && site != "none" {
            return Some(format!(
                "a call from another origin ({}): only the dashboard's own page may call its API",
                hivekernel_agents::text::shown(site)
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let same = origin
            .to_str()
            .ok()
            .and_then(|origin| origin.split_once("://"))
            .is_some_and(|(scheme, authority)| {
                matches!(scheme, "http" | "https") && authority.eq_ignore_ascii_case(host)
            });
        if !same {
            return Some(
                "a call from another origin: only the dashboard's own page may call its API"
                    .to_owned(),
            );
        }
    }
    None
}

/// The host name of a `Host` header: without its port, an IPv6 address
/// without its brackets.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn known(name: &str, hosts: &[String]) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.parse::<IpAddr>().is_ok() {
        return true;
    }
    let lower = name.to_ascii_lowercase();
    lower == "localhost" || lower.ends_with(".localhost") || hosts.contains(&lower)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use axum::http::HeaderValue;

    use super::*;
    use crate::dashboard::api::tests::headers;

    #[test]
    fn the_dashboard_answers_to_addresses_localhost_and_listed_names() {
        let hosts = vec!["kernel.example".to_owned()];
        for host in [
            "127.0.0.1:50052",
            "10.1.2.3",
            "[::1]:8080",
            "localhost:50052",
            "LocalHost",
            "ops.localhost:1",
            "kernel.example:443",
            "Kernel.Example",
        ] {
            let map = {
                let mut map = HeaderMap::new();
                map.insert(header::HOST, HeaderValue::from_str(host).unwrap());
                map
            };
            assert_eq!(refusal(&map, true, &hosts), None, "{host}");
        }
        for host in [
            "attacker.example:50052",
            "127.0.0.1.nip.io",
            "kernel.example.evil",
        ] {
            let mut map = HeaderMap::new();
            map.insert(header::HOST, HeaderValue::from_str(host).unwrap());
            let why = refusal(&map, false, &hosts).unwrap();
            assert!(why.contains("kernel.dashboard.hosts"), "{why}");
        }
        assert!(refusal(&HeaderMap::new(), false, &hosts).is_some());
    }

    #[test]
    fn an_api_call_must_come_from_the_page_itself() {
        let host = ("host", "127.0.0.1:50052");
        let ok = |pairs: &[(&'static str, &'static str)]| refusal(&headers(pairs), true, &[]);
        assert_eq!(ok(&[host]), None);
        assert_eq!(ok(&[host, ("sec-fetch-site", "same-origin")]), None);
        assert_eq!(ok(&[host, ("sec-fetch-site", "none")]), None);
        assert_eq!(ok(&[host, ("origin", "http://127.0.0.1:50052")]), None);
        assert_eq!(ok(&[host, ("origin", "https://127.0.0.1:50052")]), None);
        // Another port of the same host is the same site, not the same origin.
        assert!(ok(&[host, ("sec-fetch-site", "same-site")]).is_some());
        assert!(ok(&[host, ("sec-fetch-site", "cross-site")]).is_some());
        assert!(ok(&[host, ("origin", "http://127.0.0.1:52997")]).is_some());
        assert!(ok(&[host, ("origin", "null")]).is_some());
        assert!(ok(&[host, ("origin", "http://evil.example")]).is_some());
        // The page itself may be opened from anywhere.
        assert_eq!(
            refusal(
                &headers(&[host, ("sec-fetch-site", "cross-site")]),
                false,
                &[]
            ),
            None
        );
    }
}
