//! Registry hosts in containerd's `hosts.toml` layout, so operators can reuse their mirror and TLS
//! settings: `<config_path>/<registry>/hosts.toml` (or `_default/hosts.toml`) lists mirrors under
//! `[host."URL"]` with `capabilities`, `ca`, `client`, `skip_verify`, `override_path` and `header`,
//! then `server` (the upstream) is tried last. Without a file, docker-style `*.crt`, `*.cert` and
//! `*.key` files in the directory apply to the upstream. Plain HTTP is a host URL with `http://`.

use std::path::{Path, PathBuf};

use reqwest::Url;
use serde::Deserialize;

use super::Error;

/// One endpoint requests may go to.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// Scheme, host and port.
    pub url: Url,
    /// The path prefix of API requests (normally `/v2`).
    pub path: String,
    pub pull: bool,
    pub resolve: bool,
    pub skip_verify: bool,
    pub ca: Vec<PathBuf>,
    /// Client certificate and key (the key may be in the certificate file).
    pub client: Vec<(PathBuf, Option<PathBuf>)>,
    pub headers: Vec<(String, String)>,
    /// The upstream of a loopback registry that was not configured: tried over HTTPS first, then
    /// plain HTTP, as docker does.
    pub http_fallback: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsFile {
    server: Option<String>,
    capabilities: Option<Vec<String>>,
    ca: Option<OneOrMany<String>>,
    client: Option<ClientCerts>,
    skip_verify: Option<bool>,
    override_path: Option<bool>,
    header: Option<toml::Table>,
    dial_timeout: Option<String>,
    #[serde(default)]
    host: toml::Table,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostSettings {
    capabilities: Option<Vec<String>>,
    ca: Option<OneOrMany<String>>,
    client: Option<ClientCerts>,
    skip_verify: Option<bool>,
    override_path: Option<bool>,
    header: Option<toml::Table>,
    dial_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `client = "c.pem"`, `client = ["c.cert", "c.key"]` or `client = [["c.cert", "c.key"], ...]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ClientCerts {
    One(String),
    Pair(Vec<String>),
    Pairs(Vec<Vec<String>>),
}

/// The upstream server of a registry host name, as docker names it.
pub fn default_server(domain: &str) -> String {
    if domain == super::reference::DEFAULT_DOMAIN {
        "https://registry-1.docker.io".to_string()
    } else {
        format!("https://{domain}")
    }
}

/// Whether a registry host is on loopback (`localhost`, `127.0.0.0/8`, `::1`).
pub fn is_loopback(domain: &str) -> bool {
    let host = match domain.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => domain.split(':').next().unwrap_or(""),
    };
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// The hosts to try for `domain`, mirrors first and the upstream last.
pub fn hosts_for(config_path: &Path, domain: &str) -> Result<Vec<Host>, Error> {
    let dir = config_path.join(domain);
    let file = dir.join("hosts.toml");
    let default_file = config_path.join("_default").join("hosts.toml");
    let (dir, text) = match std::fs::read_to_string(&file) {
        Ok(t) => (dir, Some((file, t))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::read_to_string(&default_file) {
                Ok(t) => (config_path.join("_default"), Some((default_file, t))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (dir, None),
                Err(source) => {
                    return Err(Error::Io {
                        path: default_file,
                        source,
                    });
                }
            }
        }
        Err(source) => return Err(Error::Io { path: file, source }),
    };
    match text {
        Some((path, text)) => parse(&path, &dir, &text, domain),
        None => Ok(vec![bare_server(&dir, domain)?]),
    }
}

/// The upstream with docker-style certificate files from `dir`, when there is no hosts.toml.
fn bare_server(dir: &Path, domain: &str) -> Result<Host, Error> {
    let url = parse_url(&default_server(domain), &dir.join("hosts.toml"))?;
    let mut host = Host {
        path: "/v2".to_string(),
        pull: true,
        resolve: true,
        skip_verify: false,
        ca: Vec::new(),
        client: Vec::new(),
        headers: Vec::new(),
        http_fallback: is_loopback(domain),
        url,
    };
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        names.sort();
        for p in &names {
            match p.extension().and_then(|e| e.to_str()) {
                Some("crt") => host.ca.push(p.clone()),
                Some("cert") => {
                    let key = p.with_extension("key");
                    host.client.push((p.clone(), key.exists().then_some(key)));
                }
                _ => {}
            }
        }
    }
    Ok(host)
}

fn parse_url(s: &str, file: &Path) -> Result<Url, Error> {
    let with_scheme = if s.contains("://") {
        s.to_string()
    } else {
        format!("https://{s}")
    };
    let url = Url::parse(&with_scheme).map_err(|e| Error::HostsConfig {
        path: file.to_path_buf(),
        reason: format!("host {s:?} is not a URL: {e}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Error::HostsConfig {
            path: file.to_path_buf(),
            reason: format!("host {s:?} must be an http or https URL with a host"),
        });
    }
    Ok(url)
}

fn parse(file: &Path, dir: &Path, text: &str, domain: &str) -> Result<Vec<Host>, Error> {
    let bad = |reason: String| Error::HostsConfig {
        path: file.to_path_buf(),
        reason,
    };
    let parsed: HostsFile = toml::from_str(text).map_err(|e| bad(e.message().to_string()))?;
    let mut hosts = Vec::new();
    for (url, value) in parsed.host {
        let settings: HostSettings = value
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[host.{url:?}]: {}", e.message())))?;
        hosts.push(host(file, dir, &url, settings, false)?);
    }
    let explicit = parsed.server.is_some();
    let server = parsed.server.unwrap_or_else(|| default_server(domain));
    let fallback = !explicit && is_loopback(domain);
    let settings = HostSettings {
        capabilities: parsed.capabilities,
        ca: parsed.ca,
        client: parsed.client,
        skip_verify: parsed.skip_verify,
        override_path: parsed.override_path,
        header: parsed.header,
        dial_timeout: parsed.dial_timeout,
    };
    hosts.push(host(file, dir, &server, settings, fallback)?);
    Ok(hosts)
}

fn host(
    file: &Path,
    dir: &Path,
    url: &str,
    s: HostSettings,
    http_fallback: bool,
) -> Result<Host, Error> {
    let bad = |reason: String| Error::HostsConfig {
        path: file.to_path_buf(),
        reason,
    };
    let mut u = parse_url(url, file)?;
    let override_path = s.override_path.unwrap_or(false);
    let raw_path = u.path().trim_end_matches('/').to_string();
    let path = if override_path {
        raw_path
    } else if raw_path.is_empty() {
        "/v2".to_string()
    } else if raw_path.ends_with("/v2") {
        raw_path
    } else {
        format!("{raw_path}/v2")
    };
    u.set_path("");
    let caps = s
        .capabilities
        .unwrap_or_else(|| vec!["pull".into(), "resolve".into(), "push".into()]);
    for c in &caps {
        if !matches!(c.as_str(), "pull" | "resolve" | "push") {
            return Err(bad(format!(
                "host {url:?}: unknown capability {c:?} (pull, resolve, push)"
            )));
        }
    }
    let resolve_path = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() { p } else { dir.join(p) }
    };
    let ca =
        s.ca.map(OneOrMany::into_vec)
            .unwrap_or_default()
            .into_iter()
            .map(resolve_path)
            .collect();
    let client = match s.client {
        None => Vec::new(),
        Some(ClientCerts::One(c)) => vec![(resolve_path(c), None)],
        Some(ClientCerts::Pair(v)) => match v.as_slice() {
            [c] => vec![(resolve_path(c.clone()), None)],
            [c, k] => vec![(
                resolve_path(c.clone()),
                (!k.is_empty()).then(|| resolve_path(k.clone())),
            )],
            _ => return Err(bad(format!("host {url:?}: client must be [cert, key]"))),
        },
        Some(ClientCerts::Pairs(vs)) => {
            let mut out = Vec::new();
            for v in vs {
                match v.as_slice() {
                    [c] => out.push((resolve_path(c.clone()), None)),
                    [c, k] => out.push((
                        resolve_path(c.clone()),
                        (!k.is_empty()).then(|| resolve_path(k.clone())),
                    )),
                    _ => {
                        return Err(bad(format!(
                            "host {url:?}: client pairs must be [cert, key]"
                        )));
                    }
                }
            }
            out
        }
    };
    let mut headers = Vec::new();
    for (name, value) in s.header.unwrap_or_default() {
        match value {
            toml::Value::String(v) => headers.push((name, v)),
            toml::Value::Array(vs) => {
                for v in vs {
                    match v {
                        toml::Value::String(v) => headers.push((name.clone(), v)),
                        _ => {
                            return Err(bad(format!(
                                "host {url:?}: header {name:?} values must be strings"
                            )));
                        }
                    }
                }
            }
            _ => {
                return Err(bad(format!(
                    "host {url:?}: header {name:?} must be a string or strings"
                )));
            }
        }
    }
    let _ = s.dial_timeout; // accepted for compatibility; connection timeouts are crius's own
    Ok(Host {
        url: u,
        path,
        pull: caps.iter().any(|c| c == "pull"),
        resolve: caps.iter().any(|c| c == "resolve"),
        skip_verify: s.skip_verify.unwrap_or(false),
        ca,
        client,
        headers,
        http_fallback,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_detection() {
        for d in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "[::1]",
        ] {
            assert!(is_loopback(d), "{d}");
        }
        for d in [
            "docker.io",
            "10.0.0.1:5000",
            "[fe80::1]:5000",
            "localhost.example.com",
        ] {
            assert!(!is_loopback(d), "{d}");
        }
    }

    #[test]
    fn no_file_means_the_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = hosts_for(dir.path(), "docker.io").unwrap();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].url.as_str(), "https://registry-1.docker.io/");
        assert_eq!(hosts[0].path, "/v2");
        assert!(!hosts[0].http_fallback);
        let hosts = hosts_for(dir.path(), "127.0.0.1:5000").unwrap();
        assert_eq!(hosts[0].url.as_str(), "https://127.0.0.1:5000/");
        assert!(hosts[0].http_fallback);
    }

    #[test]
    fn docker_style_cert_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("reg.example:443");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ca.crt"), "x").unwrap();
        std::fs::write(d.join("client.cert"), "x").unwrap();
        std::fs::write(d.join("client.key"), "x").unwrap();
        let hosts = hosts_for(dir.path(), "reg.example:443").unwrap();
        assert_eq!(hosts[0].ca, vec![d.join("ca.crt")]);
        assert_eq!(
            hosts[0].client,
            vec![(d.join("client.cert"), Some(d.join("client.key")))]
        );
    }

    #[test]
    fn containerd_hosts_toml() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("docker.io");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("hosts.toml"),
            r#"
server = "https://registry-1.docker.io"

[host."http://127.0.0.1:5001"]
  capabilities = ["pull", "resolve"]

[host."https://mirror.internal/custom/path"]
  capabilities = ["pull"]
  ca = "mirror.crt"
  skip_verify = true
  override_path = true
  client = [["/etc/c.cert", "/etc/c.key"]]
  [host."https://mirror.internal/custom/path".header]
    x-one = "1"
    x-many = ["a", "b"]
"#,
        )
        .unwrap();
        let hosts = hosts_for(dir.path(), "docker.io").unwrap();
        assert_eq!(hosts.len(), 3);
        assert_eq!(hosts[0].url.as_str(), "http://127.0.0.1:5001/");
        assert!(hosts[0].pull && hosts[0].resolve);
        assert_eq!(hosts[0].path, "/v2");
        assert_eq!(hosts[1].path, "/custom/path");
        assert!(hosts[1].pull && !hosts[1].resolve && hosts[1].skip_verify);
        assert_eq!(hosts[1].ca, vec![d.join("mirror.crt")]);
        assert_eq!(
            hosts[1].client,
            vec![(
                PathBuf::from("/etc/c.cert"),
                Some(PathBuf::from("/etc/c.key"))
            )]
        );
        assert_eq!(hosts[1].headers.len(), 3);
        assert_eq!(hosts[2].url.as_str(), "https://registry-1.docker.io/");
        assert!(hosts[2].resolve);
    }

    #[test]
    fn default_hosts_file_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("_default");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("hosts.toml"),
            "[host.\"https://m\"]\ncapabilities = [\"pull\"]\n",
        )
        .unwrap();
        let hosts = hosts_for(dir.path(), "quay.io").unwrap();
        assert_eq!(hosts[0].url.as_str(), "https://m/");
        assert_eq!(hosts[1].url.as_str(), "https://quay.io/");

        std::fs::write(
            d.join("hosts.toml"),
            "[host.\"https://m\"]\ncapabilities = [\"fly\"]\n",
        )
        .unwrap();
        let e = hosts_for(dir.path(), "quay.io").unwrap_err().to_string();
        assert!(e.contains("fly") && e.contains("hosts.toml"), "{e}");
        std::fs::write(d.join("hosts.toml"), "servr = \"x\"\n").unwrap();
        let e = hosts_for(dir.path(), "quay.io").unwrap_err().to_string();
        assert!(e.contains("servr"), "{e}");
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    /// A mirror as an operator writes one: scheme, host, port, path, capabilities, TLS and
    /// path settings.
    #[derive(Debug, Clone)]
    struct Mirror {
        scheme: &'static str,
        host: String,
        port: Option<u16>,
        path: String,
        caps: Vec<&'static str>,
        skip_verify: bool,
        override_path: bool,
    }

    fn mirror() -> impl Strategy<Value = Mirror> {
        (
            prop::sample::select(vec!["http", "https"]),
            "[a-z]{1,8}(\\.[a-z]{2,4})?",
            proptest::option::of(1u16..),
            "(/[a-z]{1,6}){0,2}",
            prop::sample::subsequence(vec!["pull", "resolve", "push"], 0..=3),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(scheme, host, port, path, caps, skip_verify, override_path)| Mirror {
                    scheme,
                    host,
                    port,
                    path,
                    caps,
                    skip_verify,
                    override_path,
                },
            )
    }

    proptest! {
        /// Whatever the file holds, reading it ends in hosts or in an error naming the file:
        /// never a panic.
        #[test]
        fn arbitrary_text_is_read_or_refused_by_name(text in "\\PC{0,400}") {
            let file = Path::new("/etc/crius/certs.d/docker.io/hosts.toml");
            if let Err(e) = parse(file, Path::new("/etc/crius/certs.d/docker.io"), &text, "docker.io") {
                prop_assert!(e.to_string().contains("hosts.toml"), "{e}");
            }
        }

        /// Mirrors come back in file order, then the server, each with its own settings.
        #[test]
        fn mirrors_keep_their_order_and_settings(mirrors in proptest::collection::vec(mirror(), 0..5)) {
            let mut text = String::from("server = \"https://registry.example\"\n");
            let mut urls = Vec::new();
            for (i, m) in mirrors.iter().enumerate() {
                // Table keys are unique: the index keeps the hosts apart.
                let host = format!("m{i}{}", m.host);
                let port = m.port.map(|p| format!(":{p}")).unwrap_or_default();
                let url = format!("{}://{host}{port}{}", m.scheme, m.path);
                let caps: Vec<String> = m.caps.iter().map(|c| format!("{c:?}")).collect();
                text.push_str(&format!(
                    "[host.\"{url}\"]\ncapabilities = [{}]\nskip_verify = {}\noverride_path = {}\n",
                    caps.join(", "),
                    m.skip_verify,
                    m.override_path
                ));
                urls.push(host);
            }
            let dir = Path::new("/etc/crius/certs.d/docker.io");
            let hosts = parse(&dir.join("hosts.toml"), dir, &text, "docker.io").unwrap();
            prop_assert_eq!(hosts.len(), mirrors.len() + 1);
            for ((h, m), name) in hosts.iter().zip(&mirrors).zip(&urls) {
                prop_assert_eq!(h.url.scheme(), m.scheme);
                prop_assert_eq!(h.url.host_str(), Some(name.as_str()));
                // A scheme's own port is no port.
                let default = if m.scheme == "https" { 443 } else { 80 };
                prop_assert_eq!(h.url.port(), m.port.filter(|p| *p != default));
                prop_assert_eq!(h.pull, m.caps.contains(&"pull"));
                prop_assert_eq!(h.resolve, m.caps.contains(&"resolve"));
                prop_assert_eq!(h.skip_verify, m.skip_verify);
                let want = if m.override_path || m.path.ends_with("/v2") {
                    m.path.clone()
                } else {
                    format!("{}/v2", m.path)
                };
                prop_assert_eq!(&h.path, &want);
            }
            let server = hosts.last().unwrap();
            prop_assert_eq!(server.url.as_str(), "https://registry.example/");
        }
    }
}
