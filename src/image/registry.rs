//! The registry client: OCI distribution API v2 over HTTPS (or plain HTTP where configured, and
//! for loopback registries as docker does), trying mirrors before the upstream, answering
//! `Basic` and `Bearer` challenges, caching tokens per repository until they expire.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RANGE, RETRY_AFTER,
    WWW_AUTHENTICATE,
};
use reqwest::{Response, StatusCode, Url};

use sha2::{Digest as _, Sha256};

use super::Error;
use super::auth::{self, Challenge, Credentials, TokenResponse};
use super::hosts::{self, Host};
use super::manifest;
use super::reference::Reference;
use crate::content::Digest;

const USER_AGENT: &str = concat!("crius/", env!("CARGO_PKG_VERSION"));
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A registry that sends nothing for this long is treated as gone.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

/// Shared client state: HTTP clients per TLS setting, tokens, which loopback hosts speak HTTP.
pub struct Registry {
    config_path: PathBuf,
    auth_file: PathBuf,
    clients: Mutex<HashMap<String, reqwest::Client>>,
    tokens: Mutex<HashMap<(String, String), (String, Instant)>>,
    plain_http: Mutex<HashSet<String>>,
}

/// One pull's view of a repository: its hosts and credentials.
pub struct Session<'a> {
    registry: &'a Registry,
    domain: String,
    repo: String,
    hosts: Vec<Host>,
    creds: Option<Credentials>,
}

/// A manifest as the registry sent it.
pub struct FetchedManifest {
    pub data: Vec<u8>,
    pub content_type: Option<String>,
    pub digest_header: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Need {
    Resolve,
    Pull,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these maps leaves it consistent (single inserts/removes).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

impl Registry {
    pub fn new(config_path: PathBuf, auth_file: PathBuf) -> Registry {
        Registry {
            config_path,
            auth_file,
            clients: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            plain_http: Mutex::new(HashSet::new()),
        }
    }

    /// Hosts and credentials for pulling `reference`. Explicit credentials win over the auth file.
    pub async fn session(
        &self,
        reference: &Reference,
        creds: Option<Credentials>,
    ) -> Result<Session<'_>, Error> {
        let hosts = hosts::hosts_for(&self.config_path, &reference.domain)?;
        let creds = match creds.filter(|c| !c.is_empty()) {
            Some(c) => Some(c),
            None => {
                auth::from_docker_config(&self.auth_file, &reference.domain, &reference.path)
                    .await?
            }
        };
        Ok(Session {
            registry: self,
            domain: reference.domain.clone(),
            repo: reference.path.clone(),
            hosts,
            creds,
        })
    }

    fn client(&self, host: &Host) -> Result<reqwest::Client, Error> {
        let key = format!("{}|{:?}|{:?}", host.skip_verify, host.ca, host.client);
        if let Some(c) = lock(&self.clients).get(&key) {
            return Ok(c.clone());
        }
        let mut b = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .danger_accept_invalid_certs(host.skip_verify);
        let tls_err = |path: &PathBuf, reason: String| Error::HostsConfig {
            path: path.clone(),
            reason,
        };
        for ca in &host.ca {
            let pem = std::fs::read(ca).map_err(|e| tls_err(ca, format!("reading CA: {e}")))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| tls_err(ca, format!("bad CA PEM: {e}")))?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let Some((cert, key)) = host.client.first() {
            let mut pem = std::fs::read(cert)
                .map_err(|e| tls_err(cert, format!("reading client certificate: {e}")))?;
            if let Some(key) = key {
                pem.push(b'\n');
                pem.extend(
                    std::fs::read(key)
                        .map_err(|e| tls_err(key, format!("reading client key: {e}")))?,
                );
            }
            let id = reqwest::Identity::from_pem(&pem)
                .map_err(|e| tls_err(cert, format!("bad client certificate: {e}")))?;
            b = b.identity(id);
        }
        let client = b.build().map_err(|e| Error::Http {
            url: host.url.to_string(),
            source: e,
        })?;
        lock(&self.clients).insert(key, client.clone());
        Ok(client)
    }
}

impl Session<'_> {
    /// The registry as users name it, for messages.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Fetches a manifest by tag or digest (at most `MAX_MANIFEST_SIZE` bytes).
    pub async fn manifest(&self, object: &str) -> Result<FetchedManifest, Error> {
        let need = if object.starts_with("sha256:") {
            Need::Pull
        } else {
            Need::Resolve
        };
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(manifest::ACCEPT));
        let resp = self
            .request(need, &format!("/manifests/{object}"), headers)
            .await?;
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let digest_header = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let data = read_limited(resp, manifest::MAX_MANIFEST_SIZE, "manifest").await?;
        Ok(FetchedManifest {
            data,
            content_type,
            digest_header,
        })
    }

    /// The OCI 1.1 referrers index of manifest `digest` with `artifact_type`, as the registry
    /// sends it; none when the registry has no referrers API (the tag scheme is for those).
    pub async fn referrers(
        &self,
        digest: &Digest,
        artifact_type: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/vnd.oci.image.index.v1+json"),
        );
        let suffix = format!("/referrers/{digest}?artifactType={artifact_type}");
        let resp = match self.request(Need::Pull, &suffix, headers).await {
            Ok(r) => r,
            Err(Error::RegistryNotFound { .. }) => return Ok(None),
            Err(Error::Registry {
                status: 400 | 405 | 501,
                ..
            }) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // A registry without the API may answer anything: only an index counts.
        let is_index = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/vnd.oci.image.index.v1+json"));
        if !is_index {
            return Ok(None);
        }
        read_limited(resp, manifest::MAX_MANIFEST_SIZE, "referrers index")
            .await
            .map(Some)
    }

    /// Fetches a small blob (a config) whole.
    pub async fn small_blob(&self, digest: &Digest, max: u64) -> Result<Vec<u8>, Error> {
        let resp = self
            .request(Need::Pull, &format!("/blobs/{digest}"), HeaderMap::new())
            .await?;
        read_limited(resp, max, "blob").await
    }

    /// Starts a blob download from `offset`. Returns the response and whether the registry
    /// honoured the offset (206); on 200 the body is the whole blob.
    pub async fn blob(&self, digest: &Digest, offset: u64) -> Result<(Response, bool), Error> {
        let mut headers = HeaderMap::new();
        if offset > 0 {
            let v = HeaderValue::from_str(&format!("bytes={offset}-")).map_err(|e| {
                Error::Registry {
                    url: String::new(),
                    status: 0,
                    message: e.to_string(),
                }
            })?;
            headers.insert(RANGE, v);
        }
        let resp = self
            .request(Need::Pull, &format!("/blobs/{digest}"), headers)
            .await?;
        let partial = offset > 0 && resp.status() == StatusCode::PARTIAL_CONTENT;
        Ok((resp, partial))
    }

    /// Fetches bytes `start..end` of a blob (at most `max`); the registry must answer 206.
    pub async fn range(
        &self,
        digest: &Digest,
        start: u64,
        end: u64,
        max: u64,
    ) -> Result<Vec<u8>, Error> {
        let bad = |message: String| Error::Registry {
            url: format!("{}/{}/blobs/{digest}", self.domain, self.repo),
            status: 0,
            message,
        };
        if end <= start || end - start > max {
            return Err(bad(format!(
                "range {start}..{end} is empty or over {max} bytes"
            )));
        }
        let mut headers = HeaderMap::new();
        let v = HeaderValue::from_str(&format!("bytes={start}-{}", end - 1))
            .map_err(|e| bad(e.to_string()))?;
        headers.insert(RANGE, v);
        let resp = self
            .request(Need::Pull, &format!("/blobs/{digest}"), headers)
            .await?;
        if resp.status() != StatusCode::PARTIAL_CONTENT {
            return Err(bad(format!(
                "answered {} to a range request",
                resp.status()
            )));
        }
        let data = read_limited(resp, end - start, "range").await?;
        if data.len() as u64 != end - start {
            return Err(bad(format!(
                "{} bytes for a range of {}",
                data.len(),
                end - start
            )));
        }
        Ok(data)
    }

    /// Sends GET `<host path>/<repo><suffix>` to each host able to serve it until one answers.
    async fn request(
        &self,
        need: Need,
        suffix: &str,
        headers: HeaderMap,
    ) -> Result<Response, Error> {
        let mut last: Option<Error> = None;
        let able: Vec<&Host> = self
            .hosts
            .iter()
            .filter(|h| match need {
                Need::Resolve => h.resolve,
                Need::Pull => h.pull,
            })
            .collect();
        for (i, host) in able.iter().enumerate() {
            // A failing mirror gives way to the next host at once; the last one is waited for.
            let retry = i + 1 == able.len();
            match self.send(host, suffix, &headers, retry).await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(host = %host.url, error = %e, "registry host failed; trying the next");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Registry {
            url: self.domain.clone(),
            status: 0,
            message: "no configured host may serve this request (check capabilities in hosts.toml)"
                .into(),
        }))
    }

    fn url(&self, host: &Host, plain: bool, suffix: &str) -> Result<Url, Error> {
        let mut base = host.url.clone();
        if plain {
            let _ = base.set_scheme("http");
        }
        let s = format!("{}{}/{}{}", origin(&base), host.path, self.repo, suffix);
        Url::parse(&s).map_err(|e| Error::Registry {
            url: s.clone(),
            status: 0,
            message: e.to_string(),
        })
    }

    async fn send(
        &self,
        host: &Host,
        suffix: &str,
        headers: &HeaderMap,
        retry: bool,
    ) -> Result<Response, Error> {
        let most = if retry { RETRIES } else { 0 };
        let client = self.registry.client(host)?;
        let https_origin = origin(&host.url);
        let mut plain =
            host.url.scheme() == "http" || lock(&self.registry.plain_http).contains(&https_origin);
        let mut url = self.url(host, plain, suffix)?;
        let mut answered_challenge = false;
        let mut retries = 0;
        loop {
            let mut req = client.get(url.clone()).headers(headers.clone());
            for (k, v) in &host.headers {
                req = req.header(k.as_str(), v.as_str());
            }
            if let Some(auth) = self.cached_auth(&url) {
                req = req.header(AUTHORIZATION, auth);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if e.is_connect() && host.http_fallback && !plain => {
                    // A loopback registry without TLS: docker falls back to plain HTTP.
                    tracing::debug!(host = %host.url, "loopback registry: falling back to plain HTTP");
                    lock(&self.registry.plain_http).insert(https_origin.clone());
                    plain = true;
                    url = self.url(host, plain, suffix)?;
                    continue;
                }
                // No answer at all (refused, reset, timed out): again after a pause.
                Err(e) if retries < most && unanswered(&e) => {
                    retries += 1;
                    let wait = backoff(retries);
                    tracing::info!(url = %url, error = %e, retry = retries, ?wait, "registry request failed; retrying");
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Err(e) => {
                    return Err(Error::Http {
                        url: url.to_string(),
                        source: e,
                    });
                }
            };
            let status = resp.status();
            if status.is_success() {
                return Ok(resp);
            }
            // Busy or failing for now: again after the pause the registry asks for, or ours.
            if retries < most && retryable(status) {
                retries += 1;
                let wait = retry_after(resp.headers()).unwrap_or_else(|| backoff(retries));
                tracing::info!(url = %url, %status, retry = retries, ?wait, "registry busy; retrying");
                tokio::time::sleep(wait).await;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED && !answered_challenge {
                let challenge = auth::pick_challenge(
                    resp.headers()
                        .get_all(WWW_AUTHENTICATE)
                        .iter()
                        .map(|v| v.as_bytes()),
                );
                if let Some(ch) = challenge {
                    self.answer(&client, &url, ch).await?;
                    answered_challenge = true;
                    continue;
                }
            }
            let message = error_message(resp).await;
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Unauthorized {
                    registry: self.domain.clone(),
                    message: if self.creds.is_some() {
                        format!("credentials rejected: {message}")
                    } else {
                        format!("no credentials given: {message}")
                    },
                },
                StatusCode::NOT_FOUND => Error::RegistryNotFound {
                    url: url.to_string(),
                    message,
                },
                s => Error::Registry {
                    url: url.to_string(),
                    status: s.as_u16(),
                    message,
                },
            });
        }
    }

    /// Tokens are cached per registry, repository and credentials: a request must never ride
    /// on what another request's credentials earned.
    fn token_key(&self, url: &Url) -> (String, String) {
        let who = match &self.creds {
            None => "anonymous".to_string(),
            Some(c) => {
                let mut h = Sha256::new();
                for part in [
                    &c.username,
                    &c.password,
                    &c.identity_token,
                    &c.registry_token,
                ] {
                    h.update(part.as_bytes());
                    h.update([0u8]);
                }
                hex::encode(h.finalize())
            }
        };
        (origin(url), format!("{}|{who}", self.repo))
    }

    fn cached_auth(&self, url: &Url) -> Option<String> {
        let key = self.token_key(url);
        let mut tokens = lock(&self.registry.tokens);
        match tokens.get(&key) {
            Some((v, until)) if *until > Instant::now() => Some(v.clone()),
            Some(_) => {
                tokens.remove(&key);
                None
            }
            None => None,
        }
    }

    async fn answer(
        &self,
        client: &reqwest::Client,
        url: &Url,
        ch: Challenge,
    ) -> Result<(), Error> {
        let unauthorized = |message: String| Error::Unauthorized {
            registry: self.domain.clone(),
            message,
        };
        let (value, lifetime) = match ch {
            Challenge::Basic => {
                let c = self
                    .creds
                    .as_ref()
                    .filter(|c| !c.username.is_empty() || !c.password.is_empty())
                    .ok_or_else(|| {
                        unauthorized("the registry requires a user name and password".into())
                    })?;
                // Basic credentials do not expire; keep them for the process's life of the token cache.
                (auth::basic_header(c), Duration::from_secs(3600))
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                if let Some(c) = self.creds.as_ref().filter(|c| !c.registry_token.is_empty()) {
                    (
                        format!("Bearer {}", c.registry_token),
                        Duration::from_secs(3600),
                    )
                } else {
                    let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repo));
                    let (token, lifetime) = self
                        .fetch_token(client, &realm, service.as_deref(), &scope)
                        .await?;
                    (format!("Bearer {token}"), lifetime)
                }
            }
        };
        let until = Instant::now() + lifetime.saturating_sub(Duration::from_secs(5));
        let mut tokens = lock(&self.registry.tokens);
        // Expired ones go as new ones come: a key per repository and set of credentials (a
        // client's own token among them) would otherwise stay for good.
        let now = Instant::now();
        tokens.retain(|_, (_, until)| *until > now);
        if tokens.len() >= MAX_CACHED_TOKENS {
            tokens.clear();
        }
        tokens.insert(self.token_key(url), (value, until));
        Ok(())
    }

    async fn fetch_token(
        &self,
        client: &reqwest::Client,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<(String, Duration), Error> {
        let realm_url = Url::parse(realm).map_err(|e| Error::Unauthorized {
            registry: self.domain.clone(),
            message: format!("token realm {realm:?} is not a URL: {e}"),
        })?;
        let req = match self.creds.as_ref().filter(|c| !c.identity_token.is_empty()) {
            Some(c) => {
                let mut form = vec![
                    ("grant_type", "refresh_token"),
                    ("refresh_token", c.identity_token.as_str()),
                    ("client_id", "crius"),
                    ("scope", scope),
                ];
                if let Some(s) = service {
                    form.push(("service", s));
                }
                client.post(realm_url.clone()).form(&form)
            }
            None => {
                let mut q: Vec<(&str, &str)> = vec![("scope", scope)];
                if let Some(s) = service {
                    q.push(("service", s));
                }
                let mut r = client.get(realm_url.clone()).query(&q);
                if let Some(c) = self.creds.as_ref().filter(|c| !c.username.is_empty()) {
                    r = r.header(AUTHORIZATION, auth::basic_header(c));
                }
                r
            }
        };
        // The token server fails as registries do: retried as they are.
        let mut retries = 0;
        let resp = loop {
            let Some(attempt) = req.try_clone() else {
                break req.send().await.map_err(|e| Error::Http {
                    url: realm.to_string(),
                    source: e,
                })?;
            };
            match attempt.send().await {
                Ok(r) if retryable(r.status()) && retries < RETRIES => {
                    retries += 1;
                    let wait = retry_after(r.headers()).unwrap_or_else(|| backoff(retries));
                    tracing::info!(realm, status = %r.status(), retry = retries, ?wait, "token server busy; retrying");
                    tokio::time::sleep(wait).await;
                }
                Ok(r) => break r,
                Err(e) if retries < RETRIES && unanswered(&e) => {
                    retries += 1;
                    let wait = backoff(retries);
                    tracing::info!(realm, error = %e, retry = retries, ?wait, "token server unreachable; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    return Err(Error::Http {
                        url: realm.to_string(),
                        source: e,
                    });
                }
            }
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let message = error_message(resp).await;
            return Err(Error::Unauthorized {
                registry: self.domain.clone(),
                message: format!("token request answered {status}: {message}"),
            });
        }
        let body = read_limited(resp, 1 << 20, "token").await?;
        let t: TokenResponse = serde_json::from_slice(&body).map_err(|e| Error::Unauthorized {
            registry: self.domain.clone(),
            message: format!("token response is not valid JSON: {e}"),
        })?;
        let token = t.bearer().ok_or_else(|| Error::Unauthorized {
            registry: self.domain.clone(),
            message: "token response holds no token".into(),
        })?;
        Ok((token.to_string(), token_lifetime(t.expires_in)))
    }
}

/// How long a token is kept: what its server says (`expires_in`, seconds), at most an hour, so
/// a server's huge number cannot overflow the clock (the daemon's, by a panic).
fn token_lifetime(expires_in: Option<u64>) -> Duration {
    expires_in
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TOKEN_LIFETIME)
        .min(MAX_TOKEN_LIFETIME)
}

/// The most tokens kept at once (beyond it they are asked for again).
const MAX_CACHED_TOKENS: usize = 4096;

/// The longest a token is kept before a new one is asked for.
const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// How often a request that got no answer, or a busy one, is tried again.
const RETRIES: u32 = 4;

/// The longest pause a registry may ask for with Retry-After.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The pause before retry `n` (from 1): 250 ms doubling, at most 4 s.
pub(crate) fn backoff(n: u32) -> Duration {
    Duration::from_millis(250u64 << n.saturating_sub(1).min(4))
}

/// A request that got no answer at all (refused, reset, timed out), which asking again may
/// change; not one TLS refused.
fn unanswered(e: &reqwest::Error) -> bool {
    (e.is_connect() || e.is_timeout() || e.is_request()) && !tls_refused(e)
}

/// Whether TLS itself refused the server (its certificate): asking again changes nothing.
fn tls_refused(e: &reqwest::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let inner_tls = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some());
        if inner_tls || err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Statuses that say "not now" rather than "no".
fn retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::INTERNAL_SERVER_ERROR
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// A Retry-After given in seconds (the HTTP-date form is taken as no advice), capped.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Reads a whole body, refusing more than `max` bytes.
async fn read_limited(mut resp: Response, max: u64, what: &str) -> Result<Vec<u8>, Error> {
    let url = resp.url().to_string();
    if resp.content_length().is_some_and(|l| l > max) {
        return Err(Error::Registry {
            url,
            status: resp.status().as_u16(),
            message: format!("{what} is larger than the {max}-byte limit"),
        });
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| Error::Http {
        url: url.clone(),
        source: e,
    })? {
        if out.len() as u64 + chunk.len() as u64 > max {
            return Err(Error::Registry {
                url,
                status: 200,
                message: format!("{what} is larger than the {max}-byte limit"),
            });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The registry's own words from an error body (`{"errors":[{"code","message"}]}`), else the
/// status text.
async fn error_message(resp: Response) -> String {
    let status = resp.status();
    let body = read_limited(resp, 64 << 10, "error")
        .await
        .unwrap_or_default();
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<RegistryError>,
    }
    #[derive(serde::Deserialize)]
    struct RegistryError {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Errors>(&body) {
        Ok(e) if !e.errors.is_empty() => e
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_string())
            .collect::<Vec<_>>()
            .join("; "),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_lifetime_is_bounded() {
        assert_eq!(token_lifetime(None), DEFAULT_TOKEN_LIFETIME);
        assert_eq!(token_lifetime(Some(300)), Duration::from_secs(300));
        // A server's huge number is an hour, not an overflow of the clock.
        assert_eq!(token_lifetime(Some(u64::MAX)), MAX_TOKEN_LIFETIME);
        let _ = Instant::now() + token_lifetime(Some(u64::MAX));
    }
}
