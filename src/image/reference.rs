//! Image references, parsed and normalised the way docker and Kubernetes do:
//! `busybox` is `docker.io/library/busybox:latest`, a first component with a `.` or `:` (or
//! `localhost`) is a registry host, tags match `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`, and a
//! reference with both tag and digest is pulled by its digest alone.

use std::fmt;
use std::sync::Arc;

use crate::content::Digest;

pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_PREFIX: &str = "library/";
const MAX_NAME_LEN: usize = 255;

#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct ParseError {
    pub reference: String,
    pub reason: Invalid,
}

/// What is wrong with a reference.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Invalid {
    #[error("empty reference")]
    Empty,
    #[error("a 64-character hex string is an image ID, not a repository name")]
    ImageId,
    #[error("{0}")]
    Digest(Arc<crate::content::Error>),
    #[error("tag is empty")]
    TagEmpty,
    #[error("tag {tag:?} must start with a letter, digit or '_'")]
    TagStart { tag: String },
    #[error("tag is {len} characters long; at most 128 are allowed")]
    TagTooLong { len: usize },
    #[error("tag {tag:?} contains {bad:?}")]
    TagCharacter { tag: String, bad: char },
    #[error("repository name is empty")]
    NameEmpty,
    #[error("registry host {domain:?} has an unclosed '['")]
    HostUnclosed { domain: String },
    #[error("registry host {domain:?} is not a valid IPv6 address")]
    HostIpv6 { domain: String },
    #[error("registry host {domain:?} has junk after ']'")]
    HostJunk { domain: String },
    #[error("registry host {domain:?} is not a valid host name")]
    HostName { domain: String },
    #[error("registry port {port:?} is not a number from 0 to 65535")]
    Port { port: String },
    #[error("repository name must be lowercase")]
    Uppercase,
    #[error(
        "repository path component {component:?} must be lowercase letters and digits joined by '.', '_', '__' or '-'"
    )]
    PathComponent { component: String },
    #[error("repository name is longer than 255 characters")]
    TooLong,
}

/// A normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Registry host with optional port, e.g. `docker.io`, `127.0.0.1:5000`, `[::1]:5000`.
    pub domain: String,
    /// Repository path, e.g. `library/busybox`.
    pub path: String,
    /// The tag, absent when pulling by digest.
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses and normalises `s`.
    pub fn parse(s: &str) -> Result<Reference, ParseError> {
        let err = |reason: Invalid| ParseError {
            reference: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(err(Invalid::Empty));
        }
        if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err(Invalid::ImageId));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => {
                let digest: Digest = d.parse().map_err(|e| err(Invalid::Digest(Arc::new(e))))?;
                (rest, Some(digest))
            }
            None => (s, None),
        };
        // A tag follows the last ':' that comes after the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let i = last_slash + i;
                (&rest[..i], Some(&rest[i + 1..]))
            }
            None => (rest, None),
        };
        if let Some(tag) = tag {
            validate_tag(tag).map_err(err)?;
        }
        if name.is_empty() {
            return Err(err(Invalid::NameEmpty));
        }
        let (domain, path) = split_domain(name);
        validate_domain(&domain).map_err(err)?;
        if path.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(err(Invalid::Uppercase));
        }
        validate_path(&path).map_err(err)?;
        if domain.len() + 1 + path.len() > MAX_NAME_LEN {
            return Err(err(Invalid::TooLong));
        }
        let tag = match (tag, &digest) {
            // With a digest the tag is only a label: the digest decides what is pulled.
            (_, Some(_)) => None,
            (Some(t), None) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// `domain/path`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// What the registry is asked for: the digest if there is one, else the tag.
    pub fn object(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// `name:tag`, when the reference has a tag.
    pub fn repo_tag(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// `name@digest` for a given manifest digest.
    pub fn repo_digest(&self, manifest: &Digest) -> String {
        format!("{}@{manifest}", self.name())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

fn split_domain(name: &str) -> (String, String) {
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.')
                || first.contains(':')
                || first == "localhost"
                || first.starts_with('[') =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    let domain = if domain == LEGACY_DEFAULT_DOMAIN {
        DEFAULT_DOMAIN.to_string()
    } else {
        domain
    };
    let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
        format!("{OFFICIAL_PREFIX}{path}")
    } else {
        path
    };
    (domain, path)
}

fn validate_tag(tag: &str) -> Result<(), Invalid> {
    let bytes = tag.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    match bytes.first() {
        None => return Err(Invalid::TagEmpty),
        Some(&b) if !word(b) => {
            return Err(Invalid::TagStart { tag: tag.into() });
        }
        _ => {}
    }
    if bytes.len() > 128 {
        return Err(Invalid::TagTooLong { len: bytes.len() });
    }
    if let Some(bad) = bytes
        .iter()
        .find(|&&b| !(word(b) || b == b'.' || b == b'-'))
    {
        return Err(Invalid::TagCharacter {
            tag: tag.into(),
            bad: *bad as char,
        });
    }
    Ok(())
}

fn validate_domain(domain: &str) -> Result<(), Invalid> {
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        // [IPv6]:port
        let (addr, after) = rest.split_once(']').ok_or_else(|| Invalid::HostUnclosed {
            domain: domain.into(),
        })?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(Invalid::HostIpv6 {
                domain: domain.into(),
            });
        }
        match after {
            "" => return Ok(()),
            p => match p.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => {
                    return Err(Invalid::HostJunk {
                        domain: domain.into(),
                    });
                }
            },
        }
    } else {
        match domain.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(domain), None),
        }
    };
    if let Some(host) = host {
        for label in host.split('.') {
            let b = label.as_bytes();
            let ok = !b.is_empty()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-';
            if !ok {
                return Err(Invalid::HostName {
                    domain: domain.into(),
                });
            }
        }
    }
    if let Some(port) = port
        && (port.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(Invalid::Port { port: port.into() });
    }
    Ok(())
}

/// Path components: `[a-z0-9]+` joined by `.`, `_`, `__` or any run of `-`.
fn validate_path(path: &str) -> Result<(), Invalid> {
    for comp in path.split('/') {
        let b = comp.as_bytes();
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        let ok = !b.is_empty() && alnum(b[0]) && alnum(b[b.len() - 1]) && {
            let mut i = 0;
            let mut good = true;
            while i < b.len() {
                if alnum(b[i]) {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < b.len() && !alnum(b[i]) {
                    i += 1;
                }
                let sep = &comp[start..i];
                let dashes = sep.bytes().all(|c| c == b'-');
                if !(sep == "." || sep == "_" || sep == "__" || dashes) {
                    good = false;
                    break;
                }
            }
            good
        };
        if !ok {
            return Err(Invalid::PathComponent {
                component: comp.into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn normalisation_table() {
        let cases: &[(&str, &str)] = &[
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.32.0", "docker.io/library/busybox:1.32.0"),
            ("library/busybox", "docker.io/library/busybox:latest"),
            ("docker.io/busybox", "docker.io/library/busybox:latest"),
            (
                "index.docker.io/library/busybox",
                "docker.io/library/busybox:latest",
            ),
            (
                "pauseexample/mycontainer",
                "docker.io/pauseexample/mycontainer:latest",
            ),
            (
                "fictional.registry.example/imagename",
                "fictional.registry.example/imagename:latest",
            ),
            (
                "fictional.registry.example:10443/imagename",
                "fictional.registry.example:10443/imagename:latest",
            ),
            (
                "fictional.registry.example:10443/imagename:v1",
                "fictional.registry.example:10443/imagename:v1",
            ),
            ("localhost/foo", "localhost/foo:latest"),
            ("localhost:5000/a/b/c:t", "localhost:5000/a/b/c:t"),
            ("127.0.0.1:5000/busybox", "127.0.0.1:5000/busybox:latest"),
            ("[::1]:5000/busybox:x", "[::1]:5000/busybox:x"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("a/b__c/d-e/f.g", "docker.io/a/b__c/d-e/f.g:latest"),
            ("a---b", "docker.io/library/a---b:latest"),
        ];
        for (input, want) in cases {
            let r = Reference::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(r.to_string(), *want, "{input}");
        }
    }

    #[test]
    fn digests() {
        let r = Reference::parse(&format!("busybox@{D}")).unwrap();
        assert_eq!(r.to_string(), format!("docker.io/library/busybox@{D}"));
        assert_eq!(r.object(), D);
        assert_eq!(r.repo_tag(), None);
        // name:tag@digest pulls by digest only
        let r = Reference::parse(&format!("busybox:1.0@{D}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.object(), D);
        assert!(Reference::parse("busybox@sha256:abc").is_err());
        assert!(Reference::parse("busybox@md5:abc").is_err());
    }

    #[test]
    fn tags() {
        let t128 = "a".repeat(128);
        let t129 = "a".repeat(129);
        assert!(Reference::parse(&format!("busybox:{t128}")).is_ok());
        let e = Reference::parse(&format!("busybox:{t129}")).unwrap_err();
        assert!(e.reason.to_string().contains("128"), "{e}");
        assert!(Reference::parse("busybox:.x").is_err());
        assert!(Reference::parse("busybox:-x").is_err());
        assert!(Reference::parse("busybox:_x").is_ok());
        assert!(Reference::parse("busybox:A.b-C_9").is_ok());
        assert!(Reference::parse("busybox:").is_err());
        assert!(Reference::parse("busybox:a+b").is_err());
    }

    #[test]
    fn invalid_names() {
        for bad in [
            "",
            "Busybox",
            "docker.io/Library/busybox",
            "a//b",
            "/busybox",
            "busybox/",
            "-abc",
            "abc-",
            "a..b",
            "a___b",
            "host:port/x",
            "host:99999/x",
            "[::1/x",
            "[zz]:5000/x",
            "bad_host.com/x",
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            let e = Reference::parse(bad);
            assert!(e.is_err(), "{bad:?} should be rejected, got {e:?}");
        }
        let long = format!("x/{}", "a".repeat(260));
        assert!(
            Reference::parse(&long)
                .unwrap_err()
                .reason
                .to_string()
                .contains("255")
        );
    }

    #[test]
    fn upper_case_host_is_allowed() {
        // Host names are case-insensitive; only the path must be lowercase.
        assert!(Reference::parse("Registry.Example.com/x").is_ok());
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::Reference;

    proptest! {
        /// Any string parses or is refused, never panics; what parses prints as a reference
        /// that parses to itself.
        #[test]
        fn parse_is_total_and_stable(s in "[a-zA-Z0-9._:/@+-]{0,80}") {
            if let Ok(r) = Reference::parse(&s) {
                let again = Reference::parse(&r.to_string());
                prop_assert_eq!(again.as_ref().ok(), Some(&r), "{} -> {}", s, r);
            }
        }

        #[test]
        fn any_text_never_panics(s in any::<String>()) {
            let _ = Reference::parse(&s);
        }
    }
}
