//! Registry credentials and challenges: the CRI `AuthConfig` of a request, else what the
//! docker `config.json` gives for the image (its credential helper, run as docker runs one, or
//! the `auths` entry that applies: `dockercfg`); `WWW-Authenticate` challenges (`Basic`, and
//! `Bearer realm,service,scope` answered with a token from the realm).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::Error;
use super::dockercfg::{self, DockerConfig};

/// What a pull may authenticate with.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// An OAuth2 refresh token (docker's `identitytoken`), exchanged at the token realm.
    pub identity_token: String,
    /// A bearer token sent to the registry as is.
    pub registry_token: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach logs.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    pub fn is_empty(&self) -> bool {
        self.username.is_empty()
            && self.password.is_empty()
            && self.identity_token.is_empty()
            && self.registry_token.is_empty()
    }

    /// From the CRI fields; `auth` is base64 `user:password` and fills what is missing.
    pub fn from_cri(
        username: &str,
        password: &str,
        auth: &str,
        identity_token: &str,
        registry_token: &str,
    ) -> Result<Credentials, AuthFieldError> {
        let mut c = Credentials {
            username: username.to_string(),
            password: password.to_string(),
            identity_token: identity_token.to_string(),
            registry_token: registry_token.to_string(),
        };
        if !auth.is_empty() && c.username.is_empty() && c.password.is_empty() {
            let (u, p) = decode_auth(auth)?;
            c.username = u;
            c.password = p;
        }
        Ok(c)
    }
}

/// What is wrong with an `auth` field (base64 of `user:password`).
#[derive(Debug, thiserror::Error)]
pub enum AuthFieldError {
    #[error("auth is not valid base64")]
    NotBase64(#[source] base64::DecodeError),
    #[error("auth is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
    #[error("auth must encode \"user:password\"")]
    NoColon,
}

fn decode_auth(auth: &str) -> Result<(String, String), AuthFieldError> {
    let raw = STANDARD
        .decode(auth.trim())
        .map_err(AuthFieldError::NotBase64)?;
    let s = String::from_utf8(raw).map_err(AuthFieldError::NotUtf8)?;
    let (u, p) = s.split_once(':').ok_or(AuthFieldError::NoColon)?;
    Ok((u.to_string(), p.to_string()))
}

/// Credentials for repository `path` on `domain` from a docker config file: from the
/// credential helper it names for the registry, as docker asks one, else from its `auths` by
/// kubelet's matching rules (`dockercfg`); none if the file or anything that applies is missing.
pub async fn from_docker_config(
    file: &Path,
    domain: &str,
    path: &str,
) -> Result<Option<Credentials>, Error> {
    let data = match std::fs::read(file) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                path: file.to_path_buf(),
                source,
            });
        }
    };
    let bad = |reason: String| Error::AuthFile {
        path: file.to_path_buf(),
        reason,
    };
    let cfg = DockerConfig::parse(&data).map_err(|e| bad(e.to_string()))?;
    if let Some(helper) = cfg.helper_for(domain) {
        let found = from_helper(
            helper,
            &PathBuf::from(format!("docker-credential-{helper}")),
            &dockercfg::helper_server(domain),
        )
        .await?;
        if found.is_some() {
            return Ok(found);
        }
    }
    for (key, a) in cfg.matching(domain, path) {
        let c = Credentials::from_cri(
            &a.username,
            &a.password,
            &a.auth,
            &a.identitytoken,
            &a.registrytoken,
        )
        .map_err(|e| bad(format!("auths[{key:?}]: {e}")))?;
        if !c.is_empty() {
            return Ok(Some(c));
        }
    }
    Ok(None)
}

/// How long a credential helper may take (a cloud helper asks its metadata service).
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a credential helper may print; more is not an answer.
const HELPER_OUTPUT_LIMIT: usize = 1 << 20;

/// What `docker-credential-NAME get` answers.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HelperAnswer {
    #[serde(default)]
    username: String,
    #[serde(default)]
    secret: String,
}

/// Asks credential helper `helper` (the program `program`, found in PATH when it has no
/// slash) for `server`'s credentials, as docker does: `get`, the server on stdin, JSON
/// `{"Username", "Secret"}` on stdout, `<token>` as the user for an identity token. "Not found"
/// (docker's "credentials not found in native keychain") is none; anything else is an error
/// naming the helper.
pub async fn from_helper(
    helper: &str,
    program: &Path,
    server: &str,
) -> Result<Option<Credentials>, Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fail = |reason: String| Error::CredentialHelper {
        helper: helper.to_string(),
        server: server.to_string(),
        reason,
    };
    let mut child = tokio::process::Command::new(program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("cannot run it: {e}")))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(fail("no pipes to it".into()));
    };
    let talk = async {
        // A helper that does not read its input still answers: a failed write is not fatal.
        let _ = stdin.write_all(server.as_bytes()).await;
        drop(stdin);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let limit = HELPER_OUTPUT_LIMIT as u64;
        let (mut stdout, mut stderr) = (stdout.take(limit + 1), stderr.take(limit + 1));
        let (o, e) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        o.and(e)
            .map_err(|e| fail(format!("reading its answer: {e}")))?;
        let status = child
            .wait()
            .await
            .map_err(|e| fail(format!("waiting for it: {e}")))?;
        Ok::<_, Error>((status, out, err))
    };
    let (status, out, err) = tokio::time::timeout(HELPER_TIMEOUT, talk)
        .await
        .map_err(|_| fail(format!("no answer in {} s", HELPER_TIMEOUT.as_secs())))??;
    if out.len() > HELPER_OUTPUT_LIMIT {
        return Err(fail("its answer is over 1 MiB".into()));
    }
    if !status.success() {
        let said = String::from_utf8_lossy(if out.is_empty() { &err } else { &out })
            .trim()
            .to_string();
        if said.contains("credentials not found") {
            return Ok(None);
        }
        return Err(fail(format!("{status}: {said}")));
    }
    let answer: HelperAnswer = serde_json::from_slice(&out)
        .map_err(|e| fail(format!("its answer is not credentials JSON: {e}")))?;
    let creds = if answer.username == "<token>" {
        Credentials {
            identity_token: answer.secret,
            ..Default::default()
        }
    } else {
        Credentials {
            username: answer.username,
            password: answer.secret,
            ..Default::default()
        }
    };
    Ok((!creds.is_empty()).then_some(creds))
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses the first challenge crius can answer.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => {
            let params = parse_params(rest);
            let realm = params.get("realm")?.clone();
            Some(Challenge::Bearer {
                realm,
                service: params.get("service").cloned(),
                scope: params.get("scope").cloned(),
            })
        }
        _ => None,
    }
}

/// The challenge to answer among every `WWW-Authenticate` header of a 401 (a registry may send
/// Basic and Bearer in separate headers): Bearer first, since it works with and without
/// credentials, then Basic.
pub fn pick_challenge<'a>(headers: impl Iterator<Item = &'a [u8]>) -> Option<Challenge> {
    let mut all: Vec<Challenge> = headers
        .filter_map(|h| parse_challenge(&String::from_utf8_lossy(h)))
        .collect();
    match all
        .iter()
        .position(|c| matches!(c, Challenge::Bearer { .. }))
    {
        Some(i) => Some(all.swap_remove(i)),
        None => all.into_iter().next(),
    }
}

/// `key="value", key=value, ...` with quoted values that may contain commas.
fn parse_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i] == b' ' || b[i] == b',') {
            i += 1;
        }
        let ks = i;
        while i < b.len() && b[i] != b'=' {
            i += 1;
        }
        let key = s[ks..i].trim().to_ascii_lowercase();
        i += 1; // '='
        let value;
        if i < b.len() && b[i] == b'"' {
            i += 1;
            // Bytes, not chars: a realm may hold UTF-8 (an IDN host, a path).
            let mut raw = Vec::new();
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                raw.push(b[i]);
                i += 1;
            }
            value = String::from_utf8_lossy(&raw).into_owned();
            i += 1;
        } else {
            let vs = i;
            while i < b.len() && b[i] != b',' {
                i += 1;
            }
            value = s[vs.min(s.len())..i.min(s.len())].trim().to_string();
        }
        if !key.is_empty() {
            out.insert(key, value);
        }
    }
    out
}

/// The body of a token realm's answer.
#[derive(Deserialize)]
pub struct TokenResponse {
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub access_token: String,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

impl TokenResponse {
    pub fn bearer(&self) -> Option<&str> {
        [self.token.as_str(), self.access_token.as_str()]
            .into_iter()
            .find(|t| !t.is_empty())
    }
}

pub fn basic_header(c: &Credentials) -> String {
    format!(
        "Basic {}",
        STANDARD.encode(format!("{}:{}", c.username, c.password))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge("Basic realm=\"Registry Realm\""),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge("bearer realm=https://x/token"),
            Some(Challenge::Bearer {
                realm: "https://x/token".into(),
                service: None,
                scope: None
            })
        );
        assert_eq!(parse_challenge("Bearer service=\"x\""), None);
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn cri_auth_field() {
        let c = Credentials::from_cri("", "", &STANDARD.encode("bob:s3:cret"), "", "").unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("bob", "s3:cret")
        );
        assert!(Credentials::from_cri("", "", "!!", "", "").is_err());
        assert!(Credentials::from_cri("", "", &STANDARD.encode("nocolon"), "", "").is_err());
        assert!(!format!("{c:?}").contains("s3:cret"));
    }

    #[tokio::test]
    async fn docker_config_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            format!(
                r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}},"my-registry:5000":{{"username":"u","password":"p"}}}}}}"#,
                STANDARD.encode("hub:pw")
            ),
        )
        .unwrap();
        assert_eq!(
            from_docker_config(&p, "docker.io", "library/busybox")
                .await
                .unwrap()
                .unwrap()
                .username,
            "hub"
        );
        assert_eq!(
            from_docker_config(&p, "my-registry:5000", "app")
                .await
                .unwrap()
                .unwrap()
                .password,
            "p"
        );
        assert!(
            from_docker_config(&p, "quay.io", "app")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            from_docker_config(&dir.path().join("none.json"), "x", "a")
                .await
                .unwrap()
                .is_none()
        );
        std::fs::write(&p, "{").unwrap();
        assert!(
            from_docker_config(&p, "x", "a")
                .await
                .unwrap_err()
                .to_string()
                .contains("config.json")
        );
    }

    /// A credential helper as an operator would install one, here a shell script.
    fn helper(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(format!("docker-credential-{name}"));
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[tokio::test]
    async fn credential_helpers_as_docker_runs_them() {
        let dir = tempfile::tempdir().unwrap();
        // Answers for the server it was asked about, only to `get`.
        let good = helper(
            dir.path(),
            "good",
            r#"[ "$1" = get ] || exit 3
read -r server
printf '{"ServerURL":"%s","Username":"u-%s","Secret":"s3cret"}' "$server" "$server""#,
        );
        let c = from_helper("good", &good, "reg.test:5000")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("u-reg.test:5000", "s3cret")
        );
        let token = helper(
            dir.path(),
            "token",
            r#"echo '{"Username":"<token>","Secret":"refresh"}'"#,
        );
        let c = from_helper("token", &token, "r").await.unwrap().unwrap();
        assert_eq!(c.identity_token, "refresh");
        assert!(c.username.is_empty());
        // Docker's "not found" is no credentials, not an error.
        let none = helper(
            dir.path(),
            "none",
            "echo 'credentials not found in native keychain'; exit 1",
        );
        assert!(from_helper("none", &none, "r").await.unwrap().is_none());
        // Anything else names the helper and what it said.
        let broken = helper(dir.path(), "broken", "echo 'vault sealed' >&2; exit 2");
        let e = from_helper("broken", &broken, "r")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("docker-credential-broken") && e.contains("vault sealed"),
            "{e}"
        );
        let garbled = helper(dir.path(), "garbled", "echo 'not json'");
        let e = from_helper("garbled", &garbled, "r")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not credentials JSON"), "{e}");
        let e = from_helper("absent", &dir.path().join("docker-credential-absent"), "r")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot run it"), "{e}");
    }

    #[test]
    fn realms_keep_utf8_and_every_header_is_read() {
        let ch = parse_challenge("Bearer realm=\"https://auth.exämple.test/tøken\",service=\"r\"");
        match ch {
            Some(Challenge::Bearer { realm, service, .. }) => {
                assert_eq!(realm, "https://auth.exämple.test/tøken");
                assert_eq!(service.as_deref(), Some("r"));
            }
            other => panic!("{other:?}"),
        }
        // Basic in the first header, Bearer in the second: Bearer is answered.
        let headers: [&[u8]; 3] = [
            b"Negotiate",
            b"Basic realm=\"reg\"",
            b"Bearer realm=\"https://auth.test/token\"",
        ];
        assert!(matches!(
            pick_challenge(headers.into_iter()),
            Some(Challenge::Bearer { .. })
        ));
        let basic_only: [&[u8]; 2] = [b"Negotiate", b"Basic realm=\"reg\""];
        assert!(matches!(
            pick_challenge(basic_only.into_iter()),
            Some(Challenge::Basic)
        ));
        assert!(pick_challenge(std::iter::once(&b"Negotiate"[..])).is_none());
    }
}
