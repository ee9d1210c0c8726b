//! Which URLs and addresses `web_fetch` may reach, and the resolver that
//! enforces it at connect time.
//!
//! Addresses fall into three classes:
//! - **public**: always allowed;
//! - **internal** (loopback, RFC 1918, unique local, link-local, CGNAT,
//!   documentation and benchmarking ranges, ...): allowed only with
//!   `allow_private_networks`, or one by one when listed in `allow_addresses`;
//! - **never** (unspecified, broadcast, multicast, reserved, cloud metadata
//!   endpoints): refused whatever the settings, since no legitimate fetch
//!   targets them.
//!
//! IPv6 forms that carry an IPv4 address (mapped `::ffff:a.b.c.d`,
//! compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are
//! judged by the IPv4 address they carry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Where an address stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Reachable from the public internet.
    Public,
    /// A private or local network; allowed only as [`Reach`] says.
    Internal(&'static str),
    /// Never fetched.
    Never(&'static str),
}

/// Cloud instance metadata services (AWS, GCP, Azure, OpenStack; AWS ECS;
/// Alibaba; AWS over IPv6).
const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// The class of `ip`.
pub(super) fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    let [a, b, c, _] = ip.octets();
    if METADATA_V4.contains(&ip) {
        Class::Never("a cloud metadata endpoint")
    } else if a == 0 {
        Class::Never("unspecified (0.0.0.0/8)")
    } else if ip.is_broadcast() {
        Class::Never("broadcast")
    } else if ip.is_multicast() {
        Class::Never("multicast")
    } else if a >= 240 {
        Class::Never("reserved (240.0.0.0/4)")
    } else if ip.is_loopback() {
        Class::Internal("loopback")
    } else if ip.is_private() {
        Class::Internal("private (RFC 1918)")
    } else if ip.is_link_local() {
        Class::Internal("link-local")
    } else if a == 100 && (64..128).contains(&b) {
        Class::Internal("shared address space (CGNAT, 100.64.0.0/10)")
    } else if (a, b, c) == (192, 0, 0) {
        Class::Internal("IETF protocol assignments (192.0.0.0/24)")
    } else if matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113)) {
        Class::Internal("documentation")
    } else if a == 198 && (b == 18 || b == 19) {
        Class::Internal("benchmarking (198.18.0.0/15)")
    } else {
        Class::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let s = ip.segments();
    if ip == METADATA_V6 {
        return Class::Never("a cloud metadata endpoint");
    }
    if ip.is_unspecified() {
        return Class::Never("unspecified");
    }
    if ip.is_loopback() {
        return Class::Internal("loopback");
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    match s[0] {
        0xff00..=0xffff => Class::Never("multicast"),
        0xfc00..=0xfdff => Class::Internal("unique local (fc00::/7)"),
        0xfe80..=0xfebf => Class::Internal("link-local"),
        0xfec0..=0xfeff => Class::Internal("site-local"),
        0x0064 if s[1] == 0xff9b && s[2] == 1 => {
            Class::Internal("local-use NAT64 (64:ff9b:1::/48)")
        }
        0x0100 if s[1..4] == [0, 0, 0] => Class::Internal("discard-only (100::/64)"),
        0x2001 if s[1] == 0 => Class::Internal("Teredo tunnelling (2001::/32)"),
        0x2001 if s[1] == 2 && s[2] == 0 => Class::Internal("benchmarking (2001:2::/48)"),
        0x2001 if s[1] == 0x0db8 => Class::Internal("documentation (2001:db8::/32)"),
        0x0000..=0x00ff => Class::Never("reserved (::/8)"),
        _ => Class::Public,
    }
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped, IPv4-compatible,
/// NAT64 well-known prefix, or 6to4. (`::` and `::1` are not treated so.)
pub(super) fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let low = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let compatible = s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback();
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    if let Some(v4) = ip.to_ipv4_mapped() {
        Some(v4)
    } else if compatible || nat64 {
        Some(low)
    } else if s[0] == 0x2002 {
        Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]))
    } else {
        None
    }
}

/// Which internal addresses may be reached; never-class addresses stay
/// refused whatever it says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Reach {
    /// Every internal address (`allow_private_networks`).
    pub(super) private: bool,
    /// These internal addresses only (`allow_addresses`); an IPv4-mapped
    /// IPv6 address counts as its IPv4 address.
    pub(super) addresses: Arc<[IpAddr]>,
}

impl Reach {
    /// Whether the internal address `ip` may be reached.
    fn allows(&self, ip: IpAddr) -> bool {
        self.private
            || self
                .addresses
                .iter()
                .any(|allowed| allowed.to_canonical() == ip.to_canonical())
    }
}

/// Why `ip` may not be fetched, if it may not.
pub(super) fn refusal(ip: IpAddr, reach: &Reach) -> Option<String> {
    let why = match classify(ip) {
        Class::Public => return None,
        Class::Internal(_) if reach.allows(ip) => return None,
        Class::Internal(why) | Class::Never(why) => why,
    };
    let carried = match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map(|v4| format!(" (carrying IPv4 {v4})")),
        IpAddr::V4(_) => None,
    };
    Some(format!(
        "address {ip}{} is {why}",
        carried.unwrap_or_default()
    ))
}

/// Checks a URL before any request is made: http or https, a host, no
/// credentials, and an IP-literal host must be allowed. (Names are checked
/// by [`GuardedResolver`] when they are resolved.)
pub(super) fn check_url(url: &Url, reach: &Reach) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "scheme `{}:` is not allowed; only http and https",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("URLs with credentials (user:password@) are not allowed".to_owned());
    }
    let host = match url.host_str() {
        None | Some("") => return Err("the URL has no host".to_owned()),
        Some(host) => host,
    };
    // The parser has already normalised every IPv4 spelling to dotted form;
    // this is exactly the set of hosts the connector uses without DNS.
    let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    match literal.unwrap_or(host).parse::<IpAddr>() {
        Ok(ip) => refusal(ip, reach).map_or(Ok(()), Err),
        Err(_) => Ok(()),
    }
}

/// Where a redirect from `from` to `location` leads, checked like the first
/// URL; the error names the hop.
pub(super) fn redirect_target(from: &Url, location: &str, reach: &Reach) -> Result<Url, String> {
    let to = from
        .join(location)
        .map_err(|err| format!("redirect from {from} to {location:?}: not a valid URL: {err}"))?;
    check_url(&to, reach).map_err(|why| format!("refused redirect from {from} to {to}: {why}"))?;
    Ok(to)
}

/// A resolver that drops every address [`refusal`] refuses and fails when
/// none is left. reqwest connects only to what it returns, so the check and
/// the connection see the same addresses.
#[derive(Debug, Clone)]
pub(super) struct GuardedResolver {
    /// Which internal addresses are allowed.
    pub(super) reach: Reach,
}

/// Why a name gave no address to connect to; its text is what the model sees.
#[derive(Debug, thiserror::Error)]
pub(super) enum ResolveError {
    /// Every address the name resolved to is refused.
    #[error("refused: {0}")]
    Refused(String),
    /// The name did not resolve.
    #[error("{0}")]
    Failed(String),
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let reach = self.reach.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|err| ResolveError::Failed(format!("cannot resolve {host}: {err}")))?;
            let mut allowed: Vec<SocketAddr> = Vec::new();
            let mut refused = Vec::new();
            for addr in found {
                match refusal(addr.ip(), &reach) {
                    None => allowed.push(addr),
                    Some(why) => refused.push(why),
                }
            }
            if allowed.is_empty() {
                let err = if refused.is_empty() {
                    ResolveError::Failed(format!("{host} resolves to no address"))
                } else {
                    ResolveError::Refused(format!(
                        "{host} resolves only to addresses that may not be fetched: {}",
                        refused.join("; ")
                    ))
                };
                return Err(Box::new(err) as _);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Internal addresses refused.
    fn closed() -> Reach {
        Reach::default()
    }

    /// Internal addresses allowed (`allow_private_networks`).
    fn open() -> Reach {
        Reach {
            private: true,
            ..Reach::default()
        }
    }

    fn class(ip: &str) -> Class {
        classify(
            ip.parse()
                .unwrap_or_else(|_| panic!("bad test address {ip}")),
        )
    }

    #[test]
    fn public_addresses_are_allowed() {
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "2606:4700::1",
            "2a00:1450:4001:80b::200e",
            "::ffff:93.184.216.34",
            "64:ff9b::808:808",
            "2002:5db8:d822::1",
        ] {
            assert_eq!(class(ip), Class::Public, "{ip}");
        }
    }

    #[test]
    fn internal_ranges_are_internal() {
        for ip in [
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.255",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "2001:db8::1",
            "2001::1",
            "2001:2::1",
            "100::1",
            "64:ff9b:1::1",
        ] {
            assert!(
                matches!(class(ip), Class::Internal(_)),
                "{ip}: {:?}",
                class(ip)
            );
        }
    }

    #[test]
    fn never_ranges_are_never_allowed() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "169.254.169.254",
            "169.254.170.2",
            "100.100.100.200",
            "fd00:ec2::254",
            "::",
            "ff02::1",
            "::ffff:169.254.169.254",
        ] {
            assert!(
                matches!(class(ip), Class::Never(_)),
                "{ip}: {:?}",
                class(ip)
            );
            assert!(
                refusal(
                    ip.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                    &open()
                )
                .is_some()
            );
        }
    }

    #[test]
    fn embedded_ipv4_is_judged_by_its_ipv4() {
        for (ip, carried) in [
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("::127.0.0.1", "127.0.0.1"),
            ("::192.168.0.1", "192.168.0.1"),
            ("64:ff9b::127.0.0.1", "127.0.0.1"),
            ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
            ("2002:7f00:1::", "127.0.0.1"),
        ] {
            let ip: IpAddr = ip.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let carried: IpAddr = carried.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            assert_eq!(classify(ip), classify(carried), "{ip}");
            let why = refusal(ip, &closed()).unwrap_or_default();
            assert!(why.contains(&format!("carrying IPv4 {carried}")), "{why}");
        }
    }

    #[test]
    fn allow_private_opens_internal_but_not_never() {
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(refusal(loopback, &closed()).is_some_and(|w| w.contains("loopback")));
        assert_eq!(refusal(loopback, &open()), None);
        let metadata = IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254));
        assert!(refusal(metadata, &open()).is_some_and(|w| w.contains("metadata")));
    }

    #[test]
    fn listed_addresses_open_one_by_one_but_never_the_never_class() {
        let reach = Reach {
            private: false,
            addresses: Arc::from([
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
            ]),
        };
        let v4 = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));
        assert_eq!(refusal(v4(127, 0, 0, 1), &reach), None);
        assert_eq!(
            refusal(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()), &reach),
            None
        );
        assert!(refusal(v4(127, 0, 0, 2), &reach).is_some_and(|w| w.contains("loopback")));
        assert!(refusal(IpAddr::V6(Ipv6Addr::LOCALHOST), &reach).is_some());
        assert!(refusal(v4(10, 0, 0, 1), &reach).is_some());
        assert!(refusal(v4(169, 254, 169, 254), &reach).is_some_and(|w| w.contains("metadata")));
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap_or_else(|err| panic!("bad test URL {text}: {err}"))
    }

    #[test]
    fn check_url_refuses_schemes_credentials_and_literal_addresses() {
        for (text, expected) in [
            ("ftp://example.com/", "scheme `ftp:`"),
            ("file:///etc/passwd", "scheme `file:`"),
            ("data:text/plain,hi", "scheme `data:`"),
            ("javascript:alert(1)", "scheme `javascript:`"),
            ("http://user:pw@example.com/", "credentials"),
            ("http://user@example.com/", "credentials"),
            ("http://127.0.0.1/", "loopback"),
            ("http://[::1]:8080/", "loopback"),
            ("http://[::ffff:127.0.0.1]/", "carrying IPv4 127.0.0.1"),
            ("http://2130706433/", "address 127.0.0.1 is loopback"),
            ("http://0x7f.1/", "address 127.0.0.1 is loopback"),
            ("http://017700000001/", "address 127.0.0.1 is loopback"),
            ("http://169.254.169.254/latest/meta-data/", "metadata"),
            ("http://10.0.0.1/", "RFC 1918"),
            ("http://0.0.0.0:80/", "unspecified"),
            ("http://[fe80::1]/", "link-local"),
        ] {
            let why = check_url(&url(text), &closed()).err().unwrap_or_default();
            assert!(why.contains(expected), "{text}: {why:?}");
        }
        assert_eq!(
            check_url(&url("https://example.com/a?b"), &closed()),
            Ok(())
        );
        assert_eq!(check_url(&url("http://93.184.216.34/"), &closed()), Ok(()));
        assert_eq!(check_url(&url("http://127.0.0.1:9/"), &open()), Ok(()));
    }

    #[test]
    fn redirect_hops_are_checked_like_the_first_url() {
        let from = url("http://example.com/start");
        let why = redirect_target(&from, "http://127.0.0.1/admin", &closed())
            .err()
            .unwrap_or_default();
        assert!(
            why.contains(
                "refused redirect from http://example.com/start to http://127.0.0.1/admin"
            ) && why.contains("loopback"),
            "{why}"
        );
        let why = redirect_target(&from, "ftp://example.com/x", &open())
            .err()
            .unwrap_or_default();
        assert!(why.contains("scheme `ftp:`"), "{why}");
        let why = redirect_target(&from, "http://[::ffff:a9fe:a9fe]/", &open())
            .err()
            .unwrap_or_default();
        assert!(why.contains("metadata"), "{why}");
        assert_eq!(
            redirect_target(&from, "/next?q=1", &closed()).map(String::from),
            Ok("http://example.com/next?q=1".to_owned())
        );
        assert_eq!(
            redirect_target(&from, "http://127.0.0.1/admin", &open()).map(String::from),
            Ok("http://127.0.0.1/admin".to_owned())
        );
    }

    #[tokio::test]
    async fn resolver_refuses_names_of_internal_addresses() {
        let guarded = GuardedResolver { reach: closed() };
        let name: Name = "localhost".parse().unwrap_or_else(|_| panic!("name"));
        let err = guarded
            .resolve(name)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("refused: localhost resolves only to addresses that may not be fetched"),
            "{err}"
        );
        let open = GuardedResolver { reach: open() };
        let name: Name = "localhost".parse().unwrap_or_else(|_| panic!("name"));
        let addrs: Vec<SocketAddr> = open
            .resolve(name)
            .await
            .map(Iterator::collect)
            .unwrap_or_default();
        assert!(addrs.iter().any(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
