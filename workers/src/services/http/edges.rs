//! What every answer passes through before and after its page: the `Host`
//! a browser asked for, where the request came from, and the headers that
//! keep the pages out of other sites' frames.
//!
//! A page answers only a `Host` the operator named (`--console-host`), an
//! IP address, or `localhost`: a site whose name an attacker points at this
//! port (DNS rebinding) is asked for under its own name and gets 421, so
//! its scripts read nothing. The probes and `/metrics` answer any `Host`:
//! scrapers and orchestrators use service names, and what they serve is
//! what every page's reader may see anyway.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::HOST;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;

use super::*;

/// What the operator configured about the console's edges.
#[derive(Debug, Clone, Default)]
pub struct Edges {
    /// The names (with or without a port) the pages answer besides IP
    /// addresses and `localhost`.
    pub hosts: Vec<String>,
    /// Proxies whose `X-Forwarded-For` names the real source.
    pub trusted_proxies: Vec<IpAddr>,
}

impl Edges {
    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted_proxies.iter().any(|t| t.to_canonical() == ip)
    }

    fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let name = without_port(&host);
        if name == "localhost" || name.parse::<IpAddr>().is_ok() {
            return true;
        }
        self.hosts.iter().any(|h| {
            let h = h.trim().to_ascii_lowercase();
            h == host || h == name
        })
    }
}

/// `example.com:9090` → `example.com`; `[::1]:9090` → `::1`.
fn without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Where a request came from, for throttling credential checks: the peer,
/// or what a trusted proxy says the peer was.
#[derive(Debug, Clone)]
pub(super) struct Source(pub(super) String);

fn source(edges: &Edges, request: &Request) -> Source {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_canonical());
    let Some(peer) = peer else {
        return Source("unknown".into());
    };
    let mut client = peer;
    if edges.trusts(peer) {
        // Walked from the right: each proxy of ours appends the address it
        // saw, so the first hop that is not ours is the client. What lies
        // left of it is whatever the client claimed; a hop that cannot be
        // read ends the walk at the last proxy that could be.
        let hops: Vec<&str> = request
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        for hop in hops.iter().rev() {
            match hop_address(hop) {
                Some(ip) if edges.trusts(ip) => client = ip,
                Some(ip) => {
                    client = ip;
                    break;
                }
                None => break,
            }
        }
    }
    Source(bucket(client))
}

/// A hop of `X-Forwarded-For`: an address, with or without a port.
fn hop_address(hop: &str) -> Option<IpAddr> {
    let address = hop
        .parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| {
            hop.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .and_then(|h| h.parse().ok())
        })?;
    Some(address.to_canonical())
}

/// The bucket an address is counted in: itself, or for IPv6 its /64, which
/// one host is usually given whole.
fn bucket(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let prefix = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
            format!("{prefix}/64")
        }
    }
}

/// Paths for machines, not browsers: any `Host`.
fn for_machines(path: &str) -> bool {
    matches!(path, "/metrics" | "/healthz" | "/readyz")
}

pub(super) async fn edges(
    State(state): State<HttpState>,
    mut request: Request,
    next: Next,
) -> Response {
    if !for_machines(request.uri().path()) {
        let host = request.headers().get(HOST).and_then(|h| h.to_str().ok());
        match host {
            Some(host) if state.edges.allows(host) => {}
            other => {
                let named = other.map_or_else(|| "no Host".to_string(), |h| format!("{h:?}"));
                tracing::warn!(
                    host = %named,
                    path = request.uri().path(),
                    "a page was asked for under a name it does not answer"
                );
                return guarded(
                    (
                        StatusCode::MISDIRECTED_REQUEST,
                        message(
                            "misdirected request",
                            &format!(
                                "this console does not answer to {named}: it answers IP \
                                 addresses, localhost and the names given with --console-host"
                            ),
                        ),
                    )
                        .into_response(),
                );
            }
        }
    }
    let source = source(&state.edges, &request);
    request.extensions_mut().insert(source);
    guarded(next.run(request).await)
}

/// No page of ours is framed by another site's, sniffed as something
/// else, or tells other sites where its reader was.
fn guarded(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
    ] {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source_of(edges: &Edges, peer: &str, forwarded: &[&str]) -> String {
        let mut request = Request::new(axum::body::Body::empty());
        request
            .extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        for f in forwarded {
            request
                .headers_mut()
                .append("x-forwarded-for", HeaderValue::from_str(f).unwrap());
        }
        source(edges, &request).0
    }

    #[test]
    fn the_source_is_the_first_hop_that_is_not_ours() {
        let edges = Edges {
            hosts: vec![],
            trusted_proxies: vec!["10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap()],
        };
        // Not from a proxy of ours: its claims are ignored.
        assert_eq!(
            source_of(&edges, "192.0.2.1:5000", &["203.0.113.9"]),
            "192.0.2.1"
        );
        // A proxy of ours on an IPv6 listener (IPv4-mapped) is still ours.
        assert_eq!(
            source_of(&edges, "[::ffff:10.0.0.5]:5000", &["203.0.113.9"]),
            "203.0.113.9"
        );
        // Two proxies of ours; what the client claimed is left of them.
        assert_eq!(
            source_of(&edges, "10.0.0.5:1", &["1.2.3.4, 203.0.113.9, 10.0.0.6"]),
            "203.0.113.9"
        );
        // A port, a bracketed IPv6 with a port, on separate header lines.
        assert_eq!(
            source_of(&edges, "10.0.0.5:1", &["1.2.3.4", "203.0.113.9:443"]),
            "203.0.113.9"
        );
        assert_eq!(
            source_of(&edges, "10.0.0.5:1", &["[2001:db8:1:2:3:4:5:6]:443"]),
            "2001:db8:1:2::/64"
        );
        // A hop that cannot be read stops the walk at the proxy: the
        // client's forged entry to its left is not taken.
        assert_eq!(
            source_of(&edges, "10.0.0.5:1", &["1.2.3.4, unknown"]),
            "10.0.0.5"
        );
        // IPv6 clients are counted by their /64.
        assert_eq!(
            source_of(&edges, "[2001:db8:1:2::99]:1", &[]),
            "2001:db8:1:2::/64"
        );
    }

    #[test]
    fn hosts_are_ip_addresses_localhost_or_named() {
        let edges = Edges {
            hosts: vec!["shepherd.example.com".into(), "ops.example.com:8443".into()],
            trusted_proxies: vec![],
        };
        for ok in [
            "127.0.0.1:9090",
            "10.1.2.3",
            "[::1]:9090",
            "localhost:9090",
            "LOCALHOST",
            "shepherd.example.com",
            "shepherd.example.com:9090",
            "ops.example.com:8443",
        ] {
            assert!(edges.allows(ok), "{ok} refused");
        }
        for refused in [
            "evil.example.net",
            "evil.example.net:9090",
            "ops.example.com:9090",
            "localhost.evil.example.net",
            "127.0.0.1.nip.io",
            "",
        ] {
            assert!(!edges.allows(refused), "{refused} allowed");
        }
    }
}
