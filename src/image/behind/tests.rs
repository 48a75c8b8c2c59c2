use super::*;
use crate::content;
use crate::image::{ImageConfig, Layer, Options};

fn service(root: &std::path::Path) -> ImageService {
    ImageService::open(&Options {
        root: root.to_path_buf(),
        config_path: root.join("certs.d"),
        auth_file: root.join("auth.json"),
        allow_device_nodes: false,
        max_concurrent_downloads: 1,
        signature_policy: root.join("policy.json"),
        lazy_pull: true,
        lazy_whole_pull_delay: std::time::Duration::from_secs(3600),
    })
    .unwrap()
}

/// An eStargz layer known only by made-up digests (nothing is unpacked or served).
fn layer(seed: &str) -> Layer {
    let d = |what: &str| Digest::of(format!("{seed} {what}").as_bytes());
    Layer {
        digest: d("blob"),
        size: 1,
        media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
        diff_id: d("diff"),
        chain_id: d("chain"),
        toc_digest: Some(d("toc")),
    }
}

fn record(name: &str, layers: Vec<Layer>) -> Record {
    Record {
        id: Digest::of(format!("{name} config").as_bytes()),
        repo_tags: vec![format!("example.test/{name}:1")],
        repo_digests: vec![format!(
            "example.test/{name}@{}",
            Digest::of(format!("{name} manifest").as_bytes())
        )],
        manifest: Digest::of(format!("{name} manifest").as_bytes()),
        index: None,
        config_size: 1,
        layers,
        size: 2,
        pulled_at: 0,
    }
}

#[test]
fn mismatches_are_told_from_accidents() {
    let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
    let mismatches = [
        Error::DiffIdMismatch {
            digest: a.clone(),
            expected: b.clone(),
            actual: b.clone(),
        },
        Error::Content(content::Error::DigestMismatch {
            expected: a.clone(),
            actual: b.clone(),
        }),
        Error::Content(content::Error::SizeMismatch {
            digest: a.clone(),
            expected: 1,
            actual: 2,
        }),
        Error::DigestMismatch {
            what: "layer",
            expected: a.clone(),
            actual: b.clone(),
        },
        Error::SizeMismatch {
            what: "layer",
            digest: a.clone(),
            expected: 1,
            actual: 2,
        },
    ];
    for e in &mismatches {
        assert_eq!(e.mismatched(), Some(&a), "{e}");
    }
    let accidents = [
        Error::Network {
            digest: a.clone(),
            message: "connection reset".into(),
        },
        Error::Download {
            digest: a.clone(),
            message: "timed out".into(),
        },
        Error::Registry {
            url: "https://example.test/v2/".into(),
            status: 503,
            message: "busy".into(),
        },
        Error::NotFound {
            image: "example.test/a:1".into(),
        },
        Error::Content(content::Error::NotFound { digest: a.clone() }),
    ];
    for e in &accidents {
        assert_eq!(e.mismatched(), None, "{e}");
    }
}

#[tokio::test]
async fn a_refused_image_leaves_the_catalog_and_says_why_until_pulled_again() {
    let dir = tempfile::tempdir().unwrap();
    let svc = service(dir.path());
    let (base, bad) = (layer("base"), layer("bad"));
    let liar = record("liar", vec![base.clone(), bad.clone()]);
    // Another image on the same bad layer, and one sharing only the base.
    let twin = record("twin", vec![base.clone(), bad.clone()]);
    let honest = record("honest", vec![base.clone(), layer("good")]);
    for r in [&liar, &twin, &honest] {
        svc.add(r.clone(), ImageConfig::default(), false).unwrap();
    }
    let tag = liar.repo_tags[0].clone();
    let pulled = svc.lookup(&tag).unwrap().unwrap();
    let error = Error::DiffIdMismatch {
        digest: bad.digest.clone(),
        expected: bad.diff_id.clone(),
        actual: Digest::of(b"what the blob holds"),
    };
    svc.refuse(&pulled, &liar.repo_digests[0], &error).await;

    let left: Vec<Digest> = svc.list().iter().map(|i| i.record.id.clone()).collect();
    assert_eq!(left, vec![honest.id.clone()]);
    for name in names(&liar).chain(names(&twin)) {
        assert!(svc.lookup(&name).unwrap().is_none(), "{name}");
        let why = svc.refusal(&name).expect("refused").to_string();
        assert!(
            why.contains("did not match their digests")
                && why.contains(&bad.digest.to_string())
                && why.contains("pull it again"),
            "{why}"
        );
    }
    assert!(why_of(&svc, &tag).starts_with(&format!("{tag}: manifest {}", liar.manifest)));
    assert!(svc.refusal(&honest.repo_tags[0]).is_none());
    assert!(svc.refusal("example.test/never:1").is_none());
    assert!(!svc.record_path(&liar.id).exists());
    assert!(svc.record_path(&honest.id).exists());
    let bad_key = lazy::key(&bad).unwrap();
    assert!(svc.inner.lazy.distrusted(&bad_key));
    assert!(!svc.inner.lazy.distrusted(&lazy::key(&base).unwrap()));

    // A pull under the name again: found, no longer refused.
    svc.add(liar.clone(), ImageConfig::default(), false)
        .unwrap();
    assert!(svc.lookup(&tag).unwrap().is_some());
    assert!(svc.refusal(&tag).is_none());
    assert!(svc.refusal(&liar.id.to_string()).is_none());
    assert!(svc.refusal(&twin.repo_tags[0]).is_some());
}

fn why_of(svc: &ImageService, name: &str) -> String {
    svc.refusal(name).unwrap().to_string()
}

#[test]
fn the_refusals_forget_rather_than_grow() {
    let refusals = Refusals::default();
    for i in 0..MAX_REFUSALS {
        refusals.add(&record(&format!("r{i}"), Vec::new()), "why");
    }
    assert!(lock(&refusals.0).len() <= MAX_REFUSALS);
}
