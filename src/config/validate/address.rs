//! Addresses in the config: their syntax (`host:port`), and when two name
//! one endpoint (the duplicate check, and a reload telling a move from a
//! replacement).

/// Whether two addresses name one endpoint, as the duplicate check sees
/// it (`localhost:X` is `127.0.0.1:X`).
pub(in crate::config) fn same_endpoint(a: &str, b: &str) -> bool {
    let theirs = endpoints(b);
    endpoints(a).iter().any(|e| theirs.contains(e))
}

/// The endpoints a valid `host:port` names, for the duplicate check: an IP
/// literal as its socket address (`[::ffff:127.0.0.1]` and `127.0.0.1` are
/// one), `localhost` as both loopback addresses, any other name as itself,
/// lowercased (DNS names are case-insensitive).
///
/// Other names are not resolved: validation runs in `check-config` and at
/// every start and reload, and a resolver that waits on an unreachable DNS
/// server would hang it. Two different names for one host are not caught;
/// the second task then fails to bind, naming its address.
pub(super) fn endpoints(address: &str) -> Vec<String> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let Some((host, port)) = address.rsplit_once(':') else {
        return vec![address.to_owned()];
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let socket = |ip: IpAddr| {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        port.parse().map_or_else(
            |_| address.to_owned(),
            |p| SocketAddr::new(ip, p).to_string(),
        )
    };
    if let Ok(ip) = bare.parse::<IpAddr>() {
        vec![socket(ip)]
    } else if bare.eq_ignore_ascii_case("localhost") {
        vec![
            socket(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            socket(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ]
    } else {
        vec![address.to_ascii_lowercase()]
    }
}

/// `host:port` with a non-empty host (a name, an IPv4 address or a
/// bracketed IPv6 address) and a port in 1–65535.
pub(super) fn check_address(address: &str) -> Result<(), String> {
    const EXPECTED: &str = "expected host:port with a port in 1-65535, e.g. 10.0.0.1:2222";
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("no port: {EXPECTED}"));
    };
    match port.parse::<u16>() {
        Ok(p) if p >= 1 => {}
        _ => return Err(format!("bad port {port:?}: {EXPECTED}")),
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    };
    if !host_ok {
        return Err(format!(
            "bad host {host:?}: {EXPECTED} (IPv6 in brackets: [::1]:2222)"
        ));
    }
    Ok(())
}
