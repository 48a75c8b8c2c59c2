//! Generates crius's own API (`proto/crius.proto`), CRI `runtime.v1` from `k8s.io/cri-api`'s
//! `api.proto`, and NRI's message types from `github.com/containerd/nri`'s (messages only:
//! NRI's ttrpc services are crius's own code, `nri`). The two upstream files are read from
//! their published Go modules, at the versions `hack/upstream.versions` pins, through the Go
//! module cache (`go mod download`, which checks each module against Go's checksum database);
//! the repository holds no copy of them.

use std::path::{Path, PathBuf};
use std::process::Command;

type Error = Box<dyn std::error::Error>;

const VERSIONS: &str = "hack/upstream.versions";

/// The (part, version, module) pinned for `role` in `hack/upstream.versions`.
fn pinned(role: &str) -> Result<(String, String, String), Error> {
    let text = std::fs::read_to_string(VERSIONS)?;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [r, part, version, module, ..] = f[..]
            && r == role
        {
            return Ok((part.into(), version.into(), module.into()));
        }
    }
    Err(format!("{VERSIONS} pins no {role}").into())
}

/// The Go toolchain: `$CRIUS_GO`, else the one `hack/install-build-deps.sh` installs, else
/// `go` on PATH.
fn go() -> Result<PathBuf, Error> {
    if let Some(go) = std::env::var_os("CRIUS_GO") {
        return Ok(go.into());
    }
    let (part, version, _) = pinned("go")?;
    let cache = std::env::var_os("CRIUS_UPSTREAM")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/opt/crius-test/upstream".into());
    let installed = cache.join(format!("{part}-{version}/bin/go"));
    if installed.is_file() {
        return Ok(installed);
    }
    let on_path = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("go"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| {
        format!(
            "no Go toolchain to read the CRI and NRI protocol definitions from their modules with: \
             run hack/install-build-deps.sh (it installs Go {version} in {}), or set CRIUS_GO",
            installed.display()
        )
        .into()
    })
}

/// `file` in the module `role` pins, from the Go module cache.
fn module_file(role: &str, file: &str, work: &Path) -> Result<PathBuf, Error> {
    let (_, version, module) = pinned(role)?;
    let at = format!("{module}@{version}");
    let out = Command::new(go()?)
        .args(["mod", "download", "-json", &at])
        // Outside any module, whatever the checkout's parents hold.
        .current_dir(work)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .map_err(|e| format!("running go mod download {at}: {e}"))?;
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "go mod download {at}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(err) = info["Error"].as_str() {
        return Err(format!("go mod download {at}: {err}").into());
    }
    let dir = info["Dir"]
        .as_str()
        .ok_or_else(|| format!("go mod download {at} named no directory"))?;
    let path = Path::new(dir).join(file);
    if !path.is_file() {
        return Err(format!("{at} has no {file}").into());
    }
    Ok(path)
}

fn main() -> Result<(), Error> {
    println!("cargo:rerun-if-changed=proto/crius.proto");
    println!("cargo:rerun-if-changed={VERSIONS}");
    println!("cargo:rerun-if-env-changed=CRIUS_GO");
    println!("cargo:rerun-if-env-changed=CRIUS_UPSTREAM");
    tonic_prost_build::configure().compile_protos(&["proto/crius.proto"], &["proto"])?;

    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let cri = module_file("cri-api", "pkg/apis/runtime/v1/api.proto", &out)?;
    let nri = module_file("nri", "pkg/api/api.proto", &out)?;
    // Where they came from, for the unit tests that check what was generated from them.
    println!("cargo:rustc-env=CRIUS_CRI_API_PROTO={}", cri.display());
    println!("cargo:rustc-env=CRIUS_NRI_PROTO={}", nri.display());

    // Debian 12's protoc predates the `debug_redact` field option (a debugging annotation with
    // no effect on the wire): it compiles a copy without it.
    let cri_dir = out.join("cri-api");
    std::fs::create_dir_all(&cri_dir)?;
    let text = std::fs::read_to_string(&cri)?;
    std::fs::write(
        cri_dir.join("api.proto"),
        text.replace(" [debug_redact = true]", ""),
    )?;
    tonic_prost_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_protos(&[cri_dir.join("api.proto")], &[cri_dir])?;

    let nri_dir = out.join("nri");
    std::fs::create_dir_all(&nri_dir)?;
    std::fs::copy(&nri, nri_dir.join("api.proto"))?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_protos(&[nri_dir.join("api.proto")], &[nri_dir])?;
    Ok(())
}
