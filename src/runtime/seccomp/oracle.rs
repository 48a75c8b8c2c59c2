//! The compiler checked against an independent one: libseccomp, through Debian's
//! python3-seccomp (`hack/seccomp-oracle.py`), compiles the same profiles for x86_64, and both
//! programs run in the BPF interpreter over every system call number and argument values
//! around each constant the profile compares with. Prints a skip line where python3-seccomp is
//! missing (hack/install-test-deps.sh installs it).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscallBuilder,
};

use super::bpf::tests::{Data, run};
use super::{AUDIT_ARCH_X86_64, X86_64, bpf, compile_for, runtime_default};

const PYTHON: &str = "/usr/bin/python3";

/// libseccomp's program for `profile` and the names in it libseccomp does not know, or None
/// where it is not installed.
fn libseccomp(profile: &LinuxSeccomp) -> Option<(Vec<libc::sock_filter>, Vec<String>)> {
    let present = Command::new(PYTHON)
        .args(["-c", "import seccomp"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        println!("skipped: no python3-seccomp (hack/install-test-deps.sh installs it)");
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/seccomp-oracle.py");
    let dir = tempfile::tempdir().expect("temp dir");
    let unknown = dir.path().join("unknown.json");
    let mut child = Command::new(PYTHON)
        .arg(script)
        .arg(&unknown)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running the oracle");
    let json = serde_json::to_vec(profile).expect("profile as JSON");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&json)
        .expect("profile to the oracle");
    let out = child.wait_with_output().expect("the oracle's program");
    assert!(out.status.success(), "the oracle failed");
    let names = std::fs::read(&unknown).expect("the oracle's unknown names");
    Some((
        bpf::from_bytes(&out.stdout).expect("whole sock_filter records"),
        serde_json::from_slice(&names).expect("a list of names"),
    ))
}

/// Argument values worth trying for `profile`: each constant it compares with, its
/// neighbours, its complement and its high-word twins.
fn values(profile: &LinuxSeccomp) -> Vec<u64> {
    let mut v = vec![0u64, 1, u64::MAX, 0xffff_ffff, 1 << 32];
    for s in profile.syscalls().as_deref().unwrap_or_default() {
        for a in s.args().as_deref().unwrap_or_default() {
            for c in [a.value(), a.value_two().unwrap_or(0)] {
                v.extend([
                    c,
                    c.wrapping_sub(1),
                    c.wrapping_add(1),
                    !c,
                    c | 1 << 32,
                    c ^ 0xffff_ffff_0000_0000,
                ]);
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Runs both programs over the numbers and argument vectors; returns the disagreements.
fn compare(profile: &LinuxSeccomp) -> Option<Vec<String>> {
    let (theirs, unknown) = libseccomp(profile)?;
    // Calls newer than this libseccomp (Debian 12's 2.5.4 knows none after Linux 6.1):
    // it leaves them to the default action, crius filters them as the profile says.
    let newer: Vec<u32> = unknown.iter().filter_map(|n| X86_64.number(n)).collect();
    let ours = compile_for("x86_64", profile).expect("compiles").program;
    let pool = values(profile);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut differ = Vec::new();
    let numbers = (0..470u32)
        .chain([0xffff_ffff])
        .filter(|nr| !newer.contains(nr));
    for nr in numbers {
        let mut vectors = vec![[0u64; 6]];
        for i in 0..6 {
            for &v in &pool {
                let mut a = [0u64; 6];
                a[i] = v;
                vectors.push(a);
            }
        }
        for _ in 0..64 {
            let mut a = [0u64; 6];
            for x in a.iter_mut() {
                *x = pool[(next() % pool.len() as u64) as usize];
            }
            vectors.push(a);
        }
        for args in vectors {
            let d = Data {
                nr,
                arch: AUDIT_ARCH_X86_64,
                args,
            };
            let (o, t) = (run(&ours, &d), run(&theirs, &d));
            if o != t {
                differ.push(format!(
                    "nr {nr} args {args:x?}: ours {o:#x}, libseccomp {t:#x}"
                ));
            }
        }
    }
    Some(differ)
}

fn only_x86_64(mut p: LinuxSeccomp) -> LinuxSeccomp {
    p.set_architectures(Some(vec![Arch::ScmpArchX86_64]));
    p
}

#[test]
fn runtime_default_agrees_with_libseccomp() {
    let caps: Vec<String> = [
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for bounding in [vec![], caps.clone(), {
        let mut all = caps.clone();
        all.extend(["SYS_ADMIN", "SYS_PTRACE", "SYS_BOOT", "SYS_MODULE"].map(String::from));
        all
    }] {
        let p = only_x86_64(runtime_default(&bounding));
        let Some(differ) = compare(&p) else { return };
        let mut nrs: Vec<&str> = differ.iter().filter_map(|d| d.split(' ').nth(1)).collect();
        nrs.dedup();
        assert!(
            differ.is_empty(),
            "{} disagreements with capabilities {bounding:?}, numbers {nrs:?}, first: {:#?}",
            differ.len(),
            &differ[..differ.len().min(10)]
        );
    }
}

#[test]
fn every_comparison_agrees_with_libseccomp() {
    use LinuxSeccompOperator::*;
    let arg = |index: usize, op: LinuxSeccompOperator, value: u64, two: u64| {
        LinuxSeccompArgBuilder::default()
            .index(index)
            .op(op)
            .value(value)
            .value_two(two)
            .build()
            .expect("arg")
    };
    let rule = |names: &[&str], action: LinuxSeccompAction, errno: Option<u32>, args| {
        let mut b = LinuxSyscallBuilder::default()
            .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .action(action)
            .args(args);
        if let Some(e) = errno {
            b = b.errno_ret(e);
        }
        b.build().expect("rule")
    };
    let syscalls = vec![
        rule(
            &["read", "write"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![],
        ),
        rule(
            &["personality"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(0, ScmpCmpEq, 0x0008, 0)],
        ),
        rule(
            &["personality"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(0, ScmpCmpEq, 0xffff_ffff, 0)],
        ),
        rule(
            &["clone"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(0, ScmpCmpMaskedEq, 0x7e02_0000, 0)],
        ),
        rule(
            &["socket"],
            LinuxSeccompAction::ScmpActErrno,
            Some(97),
            vec![arg(0, ScmpCmpEq, 40, 0), arg(1, ScmpCmpNe, 3, 0)],
        ),
        rule(
            &["mmap"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(2, ScmpCmpLt, 0x1_0000_0004, 0)],
        ),
        rule(
            &["mprotect"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(2, ScmpCmpLe, 7, 0)],
        ),
        rule(
            &["lseek"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(2, ScmpCmpGt, 0xffff_ffff, 0)],
        ),
        rule(
            &["fcntl"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(1, ScmpCmpGe, 1024, 0)],
        ),
        // Two comparisons of one argument: either may hold (one rule each).
        rule(
            &["kill"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            vec![arg(1, ScmpCmpEq, 9, 0), arg(1, ScmpCmpEq, 15, 0)],
        ),
        rule(
            &["ptrace"],
            LinuxSeccompAction::ScmpActKillProcess,
            None,
            vec![],
        ),
        rule(&["reboot"], LinuxSeccompAction::ScmpActTrap, None, vec![]),
        rule(&["getpid"], LinuxSeccompAction::ScmpActLog, None, vec![]),
    ];
    let p = LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .architectures(vec![Arch::ScmpArchX86_64])
        .syscalls(syscalls)
        .build()
        .expect("profile");
    let Some(differ) = compare(&p) else { return };
    assert!(
        differ.is_empty(),
        "{} disagreements, first: {:#?}",
        differ.len(),
        &differ[..differ.len().min(10)]
    );
}
