//! Pushing to a registry (OCI distribution: a monolithic blob upload, a manifest PUT), shared
//! by the test harness and the benchmark, which includes this file by path.

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// A blob's digest as registries name it.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// Adds a request's credentials (none, basic, a bearer token).
pub type Auth<'a> = &'a (dyn Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder + Sync);

/// Uploads a blob (POST, then PUT with the digest) unless the repository has it; returns its
/// digest.
pub async fn blob(
    client: &reqwest::Client,
    base: &str,
    repo: &str,
    data: &[u8],
    auth: Auth<'_>,
) -> Result<String> {
    let digest = sha256(data);
    let head = auth(client.head(format!("{base}/v2/{repo}/blobs/{digest}")))
        .send()
        .await?;
    if head.status() == 200 {
        return Ok(digest);
    }
    let resp = auth(client.post(format!("{base}/v2/{repo}/blobs/uploads/")))
        .send()
        .await?;
    if resp.status() != 202 {
        bail!("starting an upload to {repo}: {}", resp.status());
    }
    let loc = resp
        .headers()
        .get("location")
        .context("no upload location")?
        .to_str()?
        .to_string();
    let loc = if loc.starts_with("http") {
        loc
    } else {
        format!("{base}{loc}")
    };
    let sep = if loc.contains('?') { '&' } else { '?' };
    let resp = auth(client.put(format!("{loc}{sep}digest={digest}")))
        .header("content-type", "application/octet-stream")
        .body(data.to_vec())
        .send()
        .await?;
    if resp.status() != 201 {
        bail!(
            "finishing an upload to {repo}: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
    }
    Ok(digest)
}

/// PUTs a manifest under `reference` (a tag or its digest); returns its digest.
pub async fn manifest(
    client: &reqwest::Client,
    base: &str,
    repo: &str,
    reference: &str,
    media_type: &str,
    data: &[u8],
    auth: Auth<'_>,
) -> Result<String> {
    let resp = auth(client.put(format!("{base}/v2/{repo}/manifests/{reference}")))
        .header("content-type", media_type)
        .body(data.to_vec())
        .send()
        .await?;
    if resp.status() != 201 {
        bail!(
            "pushing manifest {repo}:{reference}: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
    }
    Ok(sha256(data))
}
