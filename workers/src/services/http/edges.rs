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
        .map(|c| c.0.ip());
    let Some(peer) = peer else {
        return Source("unknown".into());
    };
    if edges.trusted_proxies.contains(&peer) {
        // The last hop the proxy added is the one it saw; what comes
        // before it is whatever the client claimed.
        let forwarded = request
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|a| a.trim().parse::<IpAddr>().ok())
            .next_back();
        if let Some(client) = forwarded {
            return Source(client.to_string());
        }
    }
    Source(peer.to_string())
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
