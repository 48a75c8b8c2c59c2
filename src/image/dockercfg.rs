//! Docker config credentials (a `config.json`'s `auths`, a pull secret's `.dockerconfigjson`, or
//! the legacy `.dockercfg` map) and kubelet's rules for which entries apply to an image: the
//! key's host matches the image's (each label may be a glob, `*.example.com`), its port matches,
//! and its path is a prefix of the repository's; the most specific key first. Also which
//! credential helper a `config.json` names for a registry (`credHelpers` by host, else
//! `credsStore`), as docker chooses. Used by pulls (the daemon's auth file) and by the agent (its
//! pods' pull secrets). Pure parsing: no I/O.

use serde::Deserialize;

/// One entry's credentials, as docker writes them.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Entry {
    #[serde(default)]
    pub auth: String,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
    #[serde(default)]
    pub identitytoken: String,
    #[serde(default)]
    pub registrytoken: String,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach logs.
        f.debug_struct("Entry")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The entries of a docker config, by their keys as written, and its credential helpers.
#[derive(Debug, Default)]
pub struct DockerConfig {
    entries: Vec<(String, Entry)>,
    /// `credHelpers`: registry host (with its port, if any) to helper name.
    helpers: Vec<(String, String)>,
    /// `credsStore`: the helper for every other registry.
    store: Option<String>,
}

/// A key taken apart: host (lowercase, Docker Hub's aliases as `docker.io`), port, path.
#[derive(Debug, PartialEq)]
struct Key {
    host: String,
    port: Option<String>,
    path: Vec<String>,
}

fn docker_hub(host: &str) -> String {
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".into(),
        h => h.to_string(),
    }
}

/// The server a credential helper is asked about for `domain`, as docker names it (Docker
/// Hub by its legacy index URL, every other registry by `host[:port]`).
pub fn helper_server(domain: &str) -> String {
    let (host, _) = split_port(domain);
    if docker_hub(&host.to_ascii_lowercase()) == "docker.io" {
        "https://index.docker.io/v1/".into()
    } else {
        domain.to_string()
    }
}

/// `https://host:port/path/`, `host/path` or `host`.
fn parse_key(key: &str) -> Key {
    let rest = key.split_once("://").map(|(_, r)| r).unwrap_or(key);
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = split_port(authority);
    let host = docker_hub(&host.to_ascii_lowercase());
    let mut path: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    // Docker Hub's legacy key names the API version, not a repository.
    if host == "docker.io" && matches!(path.as_slice(), [v] if v == "v1" || v == "v2") {
        path.clear();
    }
    Key { host, port, path }
}

/// `host:port`, `[::1]:port`, or a host alone.
fn split_port(authority: &str) -> (String, Option<String>) {
    if let Some(v6) = authority.strip_prefix('[') {
        let (addr, rest) = v6.split_once(']').unwrap_or((v6, ""));
        let port = rest.strip_prefix(':').map(str::to_string);
        return (format!("[{addr}]"), port);
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h.to_string(), Some(p.to_string()))
        }
        _ => (authority.to_string(), None),
    }
}

/// Shell-style `*` and `?` within one label.
fn glob(pattern: &[u8], s: &[u8]) -> bool {
    match (pattern.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&pattern[1..], s) || (!s.is_empty() && glob(pattern, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &s[1..]),
        (Some(p), Some(c)) if p == c => glob(&pattern[1..], &s[1..]),
        _ => false,
    }
}

/// Label by label, as many labels on both sides (`*.example.com` is one level only).
fn host_matches(pattern: &str, host: &str) -> bool {
    let (p, h): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), host.split('.').collect());
    p.len() == h.len()
        && p.iter()
            .zip(&h)
            .all(|(p, h)| glob(p.as_bytes(), h.as_bytes()))
}

/// What is wrong with a docker config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("\"{0}\" is not an object")]
    NotAnObject(&'static str),
    #[error("auths[{key:?}]: {source}")]
    Entry {
        key: String,
        source: serde_json::Error,
    },
    #[error("{field}: not a credential helper name")]
    HelperName { field: String },
}

impl DockerConfig {
    /// `{"auths": {KEY: ENTRY}}`, or the legacy `{KEY: ENTRY}`.
    pub fn parse(data: &[u8]) -> Result<DockerConfig, ConfigError> {
        let v: serde_json::Value = serde_json::from_slice(data)?;
        let auths = match v.get("auths") {
            Some(a) => a.clone(),
            None if v.get("credHelpers").is_some() || v.get("credsStore").is_some() => {
                serde_json::Value::Object(Default::default())
            }
            None => v.clone(),
        };
        let serde_json::Value::Object(map) = auths else {
            return Err(ConfigError::NotAnObject("auths"));
        };
        let mut entries = Vec::new();
        for (key, entry) in map {
            let e: Entry = match serde_json::from_value(entry) {
                Ok(e) => e,
                Err(source) => return Err(ConfigError::Entry { key, source }),
            };
            entries.push((key, e));
        }
        let helper_name = |field: String, v: &serde_json::Value| -> Result<String, ConfigError> {
            match v.as_str() {
                // It becomes part of a program's name: nothing that could leave PATH.
                Some(n)
                    if !n.is_empty()
                        && n.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) =>
                {
                    Ok(n.to_string())
                }
                _ => Err(ConfigError::HelperName { field }),
            }
        };
        let mut helpers = Vec::new();
        if let Some(h) = v.get("credHelpers") {
            let serde_json::Value::Object(h) = h else {
                return Err(ConfigError::NotAnObject("credHelpers"));
            };
            for (host, name) in h {
                helpers.push((
                    host.clone(),
                    helper_name(format!("credHelpers[{host:?}]"), name)?,
                ));
            }
        }
        let store = match v.get("credsStore") {
            None => None,
            Some(s) => Some(helper_name("credsStore".into(), s)?),
        };
        Ok(DockerConfig {
            entries,
            helpers,
            store,
        })
    }

    /// The credential helper for `domain` (`host[:port]`): its `credHelpers` entry (hosts
    /// compared as registry keys are), else `credsStore`.
    pub fn helper_for(&self, domain: &str) -> Option<&str> {
        let (host, port) = split_port(domain);
        let host = docker_hub(&host.to_ascii_lowercase());
        self.helpers
            .iter()
            .find(|(k, _)| {
                let k = parse_key(k);
                k.host == host && k.port == port
            })
            .map(|(_, name)| name.as_str())
            .or(self.store.as_deref())
    }

    /// The entries that apply to repository `path` on `domain` (`host[:port]`), the most
    /// specific first: the longest path, then a host without wildcards.
    pub fn matching(&self, domain: &str, path: &str) -> Vec<(&str, &Entry)> {
        let (host, port) = split_port(domain);
        let host = docker_hub(&host.to_ascii_lowercase());
        let repo: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut found: Vec<(Key, &str, &Entry)> = self
            .entries
            .iter()
            .map(|(k, e)| (parse_key(k), k.as_str(), e))
            .filter(|(k, _, _)| {
                host_matches(&k.host, &host)
                    && k.port == port
                    && k.path.len() <= repo.len()
                    && k.path.iter().zip(&repo).all(|(a, b)| a == b)
            })
            .collect();
        found.sort_by(|(a, ka, _), (b, kb, _)| {
            b.path
                .len()
                .cmp(&a.path.len())
                .then(
                    a.host
                        .contains(['*', '?'])
                        .cmp(&b.host.contains(['*', '?'])),
                )
                .then(kb.cmp(ka))
        });
        found.into_iter().map(|(_, k, e)| (k, e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(cfg: &DockerConfig, domain: &str, path: &str) -> Vec<String> {
        cfg.matching(domain, path)
            .into_iter()
            .map(|(k, _)| k.to_string())
            .collect()
    }

    #[test]
    fn kubelets_matching_rules() {
        let cfg = DockerConfig::parse(
            br#"{"auths":{
                "https://index.docker.io/v1/": {"auth": "aHViOnB3"},
                "registry.test:5000": {"username": "port"},
                "registry.test": {"username": "noport"},
                "registry.test/team": {"username": "team"},
                "registry.test/team/app": {"username": "app"},
                "*.mirror.test": {"username": "wild"},
                "[::1]:5000": {"username": "v6"}
            }}"#,
        )
        .unwrap();
        assert_eq!(
            keys(&cfg, "docker.io", "library/busybox"),
            ["https://index.docker.io/v1/"]
        );
        // Path prefixes by segment, the longest first; ports must agree.
        assert_eq!(
            keys(&cfg, "registry.test", "team/app"),
            [
                "registry.test/team/app",
                "registry.test/team",
                "registry.test"
            ]
        );
        assert_eq!(keys(&cfg, "registry.test", "teamwork/x"), ["registry.test"]);
        assert_eq!(
            keys(&cfg, "registry.test:5000", "team/app"),
            ["registry.test:5000"]
        );
        // A wildcard covers one label.
        assert_eq!(keys(&cfg, "eu.mirror.test", "x"), ["*.mirror.test"]);
        assert!(keys(&cfg, "a.eu.mirror.test", "x").is_empty());
        assert_eq!(keys(&cfg, "[::1]:5000", "x"), ["[::1]:5000"]);
        assert!(keys(&cfg, "quay.io", "x").is_empty());
    }

    #[test]
    fn legacy_and_helper_only_configs() {
        let legacy = DockerConfig::parse(br#"{"reg.test": {"username": "u"}}"#).unwrap();
        assert_eq!(keys(&legacy, "reg.test", "a"), ["reg.test"]);
        let helpers = DockerConfig::parse(br#"{"credsStore": "desktop"}"#).unwrap();
        assert!(keys(&helpers, "reg.test", "a").is_empty());
        assert_eq!(helpers.helper_for("reg.test"), Some("desktop"));
        assert!(DockerConfig::parse(b"{").is_err());
        assert!(DockerConfig::parse(br#"{"auths": []}"#).is_err());
        let err = DockerConfig::parse(br#"{"auths": {"r": {"auth": 7}}}"#).unwrap_err();
        assert!(err.to_string().contains("auths[\"r\"]"), "{err}");
    }

    #[test]
    fn credential_helpers_as_docker_chooses_them() {
        let cfg = DockerConfig::parse(
            br#"{"auths": {"reg.test": {"username": "u"}},
                 "credHelpers": {"ecr.test": "ecr-login", "reg.test:5000": "pass",
                                 "https://index.docker.io/v1/": "hub"},
                 "credsStore": "secretservice"}"#,
        )
        .unwrap();
        assert_eq!(cfg.helper_for("ecr.test"), Some("ecr-login"));
        assert_eq!(cfg.helper_for("ECR.test"), Some("ecr-login"));
        assert_eq!(cfg.helper_for("reg.test:5000"), Some("pass"));
        assert_eq!(cfg.helper_for("docker.io"), Some("hub"));
        assert_eq!(cfg.helper_for("reg.test"), Some("secretservice"));
        let none = DockerConfig::parse(br#"{"auths": {}}"#).unwrap();
        assert_eq!(none.helper_for("reg.test"), None);
        assert_eq!(helper_server("docker.io"), "https://index.docker.io/v1/");
        assert_eq!(helper_server("reg.test:5000"), "reg.test:5000");
        // A helper name is part of a program's name: no path, nothing empty.
        for bad in [
            r#"{"credsStore": "../../bin/sh"}"#,
            r#"{"credsStore": ""}"#,
            r#"{"credHelpers": {"r": 1}}"#,
            r#"{"credHelpers": []}"#,
        ] {
            assert!(DockerConfig::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
