//! Configuration shared by every backend: one URL grammar, a redacting [`Secret`],
//! parsers for the values backends take, and environment overrides. A backend keeps
//! only its table of keys; the parsing, the decoding and the error messages are these.
//!
//! # The URL grammar
//!
//! `scheme://[user[:password]@][host[,host…]][/path][?key=value&…]`
//!
//! - The scheme is case-insensitive (`ETCD://` is `etcd://`).
//! - The authority ends at the first `/`, `?` or `#`; user info is what comes before
//!   its last `@`, and the hosts are separated by commas (a store cluster). An empty
//!   entry in a host list is an error; an empty authority is allowed (`mem://`).
//! - User info, path, query keys and query values are percent-decoded the same way for
//!   every backend; a `%` not followed by two hex digits is an error, and so is a
//!   decoded text that is not UTF-8. In query keys and values `+` stands for a space
//!   (form encoding, as browsers and most URL libraries write queries); in user info
//!   and paths it is a plain `+`.
//! - A `#fragment` is an error, and so is a query key given twice.
//! - Errors start with `url:`, name the part that is wrong, and never repeat the
//!   password.
//!
//! The `url` crate is not used for the authority because it does not accept a list of
//! hosts; everything after the authority follows the same RFC 3986 rules it does.

use std::fmt;

use crate::error::{Error, Result};
pub use crate::name::check_printable;

mod values;

pub use values::{
    env_overrides, finish, from_env_table, parse_bool, parse_duration, parse_millis, parse_number,
    unknown_key, unknown_key_in, Credentials, Timeouts, TlsFiles,
};

/// A credential (password, key, token). Its `Debug` and `Display` print `<redacted>`;
/// [`expose`](Secret::expose) gives the text to the code that sends it to the store.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wrap a credential.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The credential itself, for the store client. Never log or format it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A backend URL, parsed and decoded by the grammar above. Its `Debug` shows the
/// password as `<redacted>` (see [`Secret`]).
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct BackendUrl {
    /// The scheme, lowercase.
    pub scheme: String,
    /// The user name before `@`, decoded (`None` without user info, and for
    /// `:password@`, a password alone).
    pub username: Option<String>,
    /// The password after `user:`, decoded.
    pub password: Option<Secret>,
    /// The hosts of the authority, as written (`host`, `host:port`, `[v6]:port`).
    pub hosts: Vec<String>,
    /// The path, decoded, with its leading `/` (empty when there is none).
    pub path: String,
    /// The query's key-value pairs in order, decoded (a key without `=` has an empty
    /// value).
    pub query: Vec<(String, String)>,
}

impl BackendUrl {
    /// Parse `url` by the grammar of this module.
    pub fn parse(url: &str) -> Result<Self> {
        let (scheme, rest) = split_scheme(url)?;
        if rest.contains('#') {
            return Err(Error::invalid("url: a #fragment is not supported"));
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, rest) = rest.split_at(end);
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, q),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = decode("user name", user, false)?;
                let password = password
                    .map(|p| decode("password", p, false).map(Secret))
                    .transpose()?;
                if user.is_empty() && password.is_none() {
                    return Err(Error::invalid("url: nothing before @"));
                }
                ((!user.is_empty()).then_some(user), password)
            }
        };
        Ok(BackendUrl {
            scheme,
            username,
            password,
            hosts: parse_hosts(hosts)?,
            path: decode("path", path, false)?,
            query: parse_query(query)?,
        })
    }

    /// The value of query key `key`, if given.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Check the scheme against the ones a backend answers to.
    pub fn expect_scheme(&self, schemes: &[&str]) -> Result<()> {
        if schemes.contains(&self.scheme.as_str()) {
            return Ok(());
        }
        let known: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        Err(Error::invalid(format!(
            "url: scheme {:?} is not {}",
            self.scheme,
            known.join(" or ")
        )))
    }

    /// The user name and password before `@`.
    pub fn credentials(&self) -> Credentials {
        Credentials {
            username: self.username.clone(),
            password: self.password.clone(),
        }
    }

    /// Fail when the URL carries user info (for backends that take credentials from
    /// elsewhere); `hint` says where they go instead.
    pub fn forbid_userinfo(&self, hint: &str) -> Result<()> {
        if self.username.is_some() {
            return Err(Error::invalid(format!(
                "url: credentials do not go in the URL; {hint}"
            )));
        }
        Ok(())
    }

    /// Fail when the URL has a path (other than a lone `/`); `hint` says what to use.
    pub fn forbid_path(&self, hint: &str) -> Result<()> {
        if !self.path.is_empty() && self.path != "/" {
            return Err(Error::invalid(format!("url: no path allowed; {hint}")));
        }
        Ok(())
    }
}

/// Split `scheme://rest` into its lowercase scheme and the rest; a URL without `://`
/// or with an empty or non-alphanumeric scheme is `InvalidArgument`.
pub fn split_scheme(url: &str) -> Result<(String, &str)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::invalid(
            "url: expected scheme://…, e.g. mem:// or etcd://127.0.0.1:2379",
        ));
    };
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(Error::invalid(format!(
            "url: {scheme:?} is not a valid scheme"
        )));
    }
    Ok((scheme.to_ascii_lowercase(), rest))
}

/// Split one host of [`BackendUrl::hosts`] into host and port: `name:port`,
/// `1.2.3.4:port`, `[v6]:port`; without a port, `default_port` (an error when `None`).
/// The host comes back without brackets.
pub fn host_port(host: &str, default_port: Option<u16>) -> Result<(String, u16)> {
    let bad = |why: String| Err(Error::invalid(format!("url: host {host:?}: {why}")));
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((name, "")) => (name, None),
            Some((name, port)) => match port.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None => return bad("expected [address]:port".into()),
            },
            None => return bad("']' is missing".into()),
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) if !port.contains(':') => (name, Some(port)),
            Some(_) => return bad("an IPv6 address goes in brackets: [::1]:port".into()),
            None => (host, None),
        }
    };
    if name.is_empty() {
        return bad("the host name is empty".into());
    }
    let port = match (port, default_port) {
        (Some(p), _) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return bad(format!("port {p:?} is not a number from 1 to 65535")),
        },
        (None, Some(p)) => p,
        (None, None) => return bad("expected host:port".into()),
    };
    Ok((name.to_string(), port))
}

fn parse_hosts(hosts: &str) -> Result<Vec<String>> {
    if hosts.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(Error::invalid(format!(
                "url: empty host in the host list {hosts:?}"
            )));
        }
        if let Some(c) = host.chars().find(|c| {
            !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '[' | ']'))
        }) {
            return Err(Error::invalid(format!(
                "url: host {host:?}: character {c:?} is not allowed in a host"
            )));
        }
        out.push(host.to_string());
    }
    Ok(out)
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode("parameter name", raw_key, true)?;
        let value = decode(&key, raw_value, true)?;
        if pairs.iter().any(|(k, _)| *k == key) {
            return Err(Error::invalid(format!(
                "url: parameter {key:?} is given twice"
            )));
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Percent-decode one part of a URL; `what` names it in errors (never its value, which
/// may be a password). With `plus_is_space`, `+` decodes to a space.
fn decode(what: &str, s: &str, plus_is_space: bool) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let byte = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                let Some(byte) = byte else {
                    return Err(Error::invalid(format!(
                        "url: {what}: '%' must be followed by two hex digits"
                    )));
                };
                out.push(byte);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::invalid(format!("url: {what}: not UTF-8 after decoding")))
}

/// Percent-encode what is not unreserved (RFC 3986), for showing a URL back.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ErrorKind;

    fn bad(url: &str) -> String {
        let e = BackendUrl::parse(url).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}");
        e.message().to_string()
    }

    #[test]
    fn every_part_is_read() {
        let u =
            BackendUrl::parse("ETCD://us%40er:p%3Ass+@h1:2379, h2:2379/a%2Fb+c?x=1+2&y=%C3%A9&z")
                .unwrap();
        assert_eq!(u.scheme, "etcd");
        assert_eq!(u.username.as_deref(), Some("us@er"));
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("p:ss+"));
        assert_eq!(u.hosts, ["h1:2379", "h2:2379"]);
        assert_eq!(u.path, "/a/b+c");
        assert_eq!(u.param("x"), Some("1 2"));
        assert_eq!(u.param("y"), Some("é"));
        assert_eq!(u.param("z"), Some(""));
        assert_eq!(u.param("w"), None);
    }

    #[test]
    fn empty_parts() {
        let u = BackendUrl::parse("mem://").unwrap();
        assert!(u.hosts.is_empty() && u.path.is_empty() && u.query.is_empty());
        assert!(u.username.is_none() && u.password.is_none());
        let u = BackendUrl::parse("zk://[::1]:2181/?").unwrap();
        assert_eq!((u.hosts[0].as_str(), u.path.as_str()), ("[::1]:2181", "/"));
    }

    #[test]
    fn bad_urls_name_the_part() {
        assert!(bad("etcd://h:1?a=%zz").contains("a: '%'"));
        assert!(bad("etcd://h:1?%4=1").contains("parameter name"));
        assert!(bad("etcd://h:1/%").contains("path"));
        assert!(bad("etcd://h:1?a=%ff").contains("UTF-8"));
        assert!(bad("etcd://a,,b").contains("empty host"));
        assert!(bad("etcd://a,").contains("empty host"));
        assert!(bad("etcd://a b").contains("not allowed in a host"));
        assert!(bad("etcd://h#frag").contains("fragment"));
        assert!(bad("etcd://h?a=1&a=2").contains("twice"));
        assert!(bad("etcd://@h").contains("nothing before @"));
        let u = BackendUrl::parse("redis://:pw@h").unwrap();
        assert_eq!((u.username, u.password), (None, Some(Secret::new("pw"))));
        assert!(bad("etcd:/h").contains("scheme://"));
        assert!(bad("1x://h").contains("not a valid scheme"));
        assert!(bad("://h").contains("not a valid scheme"));
    }

    #[test]
    fn passwords_never_show() {
        let u = BackendUrl::parse("redis://u:hunter2@h:1").unwrap();
        assert!(!format!("{u:?}").contains("hunter2"));
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "<redacted> <redacted>");
        for url in ["redis://u:hunter2%zz@h", "redis://u:hunter2%ff@h"] {
            assert!(!bad(url).contains("hunter2"), "{url}");
        }
    }

    #[test]
    fn schemes_and_forbidden_parts() {
        let u = BackendUrl::parse("Rediss://u@h/x").unwrap();
        assert!(u.expect_scheme(&["redis", "rediss"]).is_ok());
        let e = u.expect_scheme(&["etcd", "etcds"]).unwrap_err();
        assert_eq!(
            e.message(),
            "url: scheme \"rediss\" is not etcd:// or etcds://"
        );
        assert!(u.forbid_userinfo("use X").is_err());
        assert!(u.forbid_path("use ?prefix=").is_err());
        assert!(BackendUrl::parse("etcd://h/")
            .unwrap()
            .forbid_path("")
            .is_ok());
    }

    #[test]
    fn hosts_and_ports() {
        assert_eq!(host_port("h:1", None).unwrap(), ("h".into(), 1));
        assert_eq!(host_port("h", Some(7)).unwrap(), ("h".into(), 7));
        assert_eq!(host_port("[::1]:9", None).unwrap(), ("::1".into(), 9));
        assert_eq!(host_port("[::1]", Some(7)).unwrap(), ("::1".into(), 7));
        for (host, needle) in [
            ("h", "host:port"),
            ("h:0", "port \"0\""),
            ("h:x", "port \"x\""),
            (":1", "empty"),
            ("::1", "brackets"),
            ("[::1", "missing"),
            ("[::1]x", "[address]:port"),
        ] {
            let e = host_port(host, None).unwrap_err();
            assert!(e.message().contains(needle), "{host}: {e}");
        }
    }

    #[test]
    fn values() {
        assert_eq!(
            parse_millis("t", "250").unwrap(),
            Duration::from_millis(250)
        );
        assert!(parse_millis("t", "0").is_err());
        assert!(parse_millis("t", "-1")
            .unwrap_err()
            .message()
            .starts_with("t: "));
        assert_eq!(
            parse_duration("d", "1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("d", " 2.5s").unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(parse_duration("d", "2m").unwrap(), Duration::from_secs(120));
        for bad in ["10", "s", "-1s", "1e99s", "NaNs", "infs", "x"] {
            assert!(parse_duration("d", bad).is_err(), "{bad}");
        }
        assert!(parse_bool("b", "ON").unwrap());
        assert!(!parse_bool("b", "no").unwrap());
        assert!(parse_bool("b", "maybe").is_err());
        assert_eq!(parse_number("db", "15", 0, 15).unwrap(), 15);
        assert!(parse_number("db", "16", 0, 15).is_err());
        assert_eq!(encode("a b/é"), "a%20b%2F%C3%A9");
        let e = unknown_key("x", &["a", "b"]);
        assert_eq!(e.message(), "url: unknown parameter \"x\" (known: a, b)");
    }

    #[test]
    fn environment_overrides_name_the_variable() {
        let env = |name: &str| match name {
            "T_A" => Some("1".to_string()),
            "T_B" => Some("  ".to_string()),
            "T_C" => Some("bad".to_string()),
            _ => None,
        };
        let mut seen = Vec::new();
        env_overrides(env, &[("T_A", "a"), ("T_B", "b")], |k, v| {
            seen.push((k.to_string(), v));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [("a".to_string(), "1".to_string())]);
        let e =
            env_overrides(env, &[("T_C", "c")], |k, v| parse_bool(k, &v).map(|_| ())).unwrap_err();
        assert_eq!(e.message(), "T_C: c: \"bad\" is not true or false");
    }
}
