//! Property tests of the seccomp profile reader and compiler: whatever a Localhost profile
//! file holds, crius refuses it or compiles it, never panics.

use proptest::prelude::*;

fn action() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("SCMP_ACT_ALLOW"),
        Just("SCMP_ACT_ERRNO"),
        Just("SCMP_ACT_KILL"),
        Just("SCMP_ACT_LOG"),
        Just("SCMP_ACT_TRACE"),
        Just("SCMP_ACT_BOGUS"),
    ]
}

proptest! {
    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = super::parse(std::path::Path::new("p.json"), &bytes, &[]);
    }

    /// Profiles of the right shape with arbitrary names, actions and argument filters.
    #[test]
    fn shaped_profiles_compile_or_are_refused(
        default in action(),
        rules in proptest::collection::vec(
            (proptest::collection::vec("[a-z_0-9]{1,20}", 1..4), action(), 0u32..8, any::<u64>()),
            0..6,
        ),
    ) {
        let syscalls: Vec<serde_json::Value> = rules
            .iter()
            .map(|(names, action, index, value)| {
                serde_json::json!({
                    "names": names,
                    "action": action,
                    "args": [{"index": index, "value": value, "op": "SCMP_CMP_EQ"}],
                })
            })
            .collect();
        let profile = serde_json::json!({
            "defaultAction": default,
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": syscalls,
        });
        let bytes = serde_json::to_vec(&profile).unwrap();
        if let Ok(p) = super::parse(std::path::Path::new("p.json"), &bytes, &[]) {
            let _ = super::compile(&p);
        }
    }
}
