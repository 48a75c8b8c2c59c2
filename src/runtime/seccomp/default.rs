//! The RuntimeDefault profile: the coverage of containerd's and Docker's default (an allow-list
//! refusing everything else with EPERM, argument checks on `clone`, `personality` and `socket`,
//! extra calls for the capabilities the container holds), written as our own tables.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompOperator, LinuxSyscall,
};

/// Calls every container may make. Names of every x86 ABI; each ABI takes the ones it has.
#[rustfmt::skip]
const ALLOWED: &[&str] = &[
    "_llseek", "_newselect", "accept", "accept4", "access", "adjtimex", "alarm", "arch_prctl",
    "bind", "brk", "cachestat", "capget", "capset", "chdir", "chmod", "chown", "chown32",
    "clock_adjtime", "clock_adjtime64", "clock_getres", "clock_getres_time64", "clock_gettime",
    "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range",
    "connect", "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1",
    "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old",
    "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat", "faccessat2",
    "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat",
    "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr",
    "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64",
    "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex", "futex_requeue",
    "futex_time64", "futex_wait", "futex_waitv", "futex_wake", "futimesat", "get_robust_list",
    "get_thread_area", "getcpu", "getcwd", "getdents", "getdents64", "getegid", "getegid32",
    "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer",
    "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
    "getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit", "getrusage", "getsid",
    "getsockname", "getsockopt", "gettid", "gettimeofday", "getuid", "getuid32", "getxattr",
    "getxattrat", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    "io_setup", "io_submit", "ioctl", "ioprio_get", "ioprio_set", "ipc", "kill",
    "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
    "lchown32", "lgetxattr", "link", "linkat", "listen", "listmount", "listxattr", "listxattrat",
    "llistxattr", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise",
    "map_shadow_stack", "membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir",
    "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "mmap2",
    "modify_ldt", "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap",
    "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap",
    "name_to_handle_at", "nanosleep", "newfstatat", "open", "openat", "openat2", "pause",
    "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64", "preadv", "preadv2",
    "prlimit64", "process_mrelease", "process_vm_readv", "process_vm_writev", "pselect6",
    "pselect6_time64", "ptrace", "pwrite64", "pwritev", "pwritev2", "read", "readahead",
    "readlink", "readlinkat", "readv", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64",
    "recvmsg", "remap_file_pages", "removexattr", "removexattrat", "rename", "renameat",
    "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
    "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getaffinity", "sched_getattr", "sched_getparam",
    "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield",
    "seccomp", "select", "semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "send",
    "sendfile", "sendfile64", "sendmmsg", "sendmsg", "sendto", "set_robust_list",
    "set_thread_area", "set_tid_address", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32",
    "setgid", "setgid32", "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority",
    "setregid", "setregid32", "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid",
    "setreuid32", "setrlimit", "setsid", "setsockopt", "setuid", "setuid32", "setxattr",
    "setxattrat", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd",
    "signalfd4", "sigprocmask", "sigreturn", "socketpair", "splice", "stat",
    "stat64", "statfs", "statfs64", "statmount", "statx", "symlink", "symlinkat", "sync",
    "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create",
    "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
    "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64",
    "timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate", "truncate64",
    "ugetrlimit", "umask", "uname", "unlink", "unlinkat", "uretprobe", "utime", "utimensat",
    "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4", "waitid", "waitpid", "write",
    "writev",
];

/// Calls allowed when the container's bounding set holds the capability.
#[rustfmt::skip]
const BY_CAPABILITY: &[(&str, &[&str])] = &[
    ("DAC_READ_SEARCH", &["open_by_handle_at"]),
    (
        "SYS_ADMIN",
        &[
            "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
            "lookup_dcookie", "lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr",
            "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open", "quotactl",
            "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog", "umount",
            "umount2", "unshare",
        ],
    ),
    ("SYS_BOOT", &["reboot"]),
    ("SYS_CHROOT", &["chroot"]),
    ("SYS_MODULE", &["delete_module", "init_module", "finit_module"]),
    ("SYS_PACCT", &["acct"]),
    (
        "SYS_PTRACE",
        &["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"],
    ),
    ("SYS_RAWIO", &["iopl", "ioperm"]),
    ("SYS_TIME", &["settimeofday", "stime", "clock_settime", "clock_settime64"]),
    ("SYS_TTY_CONFIG", &["vhangup"]),
    (
        "SYS_NICE",
        &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    ),
    ("SYSLOG", &["syslog"]),
    ("BPF", &["bpf"]),
    ("PERFMON", &["perf_event_open"]),
];

/// Personas `personality` may set: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
const PERSONAS: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Socket families allowed beyond AF_UNIX..AF_ROSE (below 12): the ones still in the kernel,
/// except AF_ALG (38, a kernel crypto attack surface) and AF_VSOCK (40, not confined by network
/// namespaces).
const SOCKET_FAMILIES: [u64; 25] = [
    13, 14, 15, 16, 17, 18, 21, 22, 24, 26, 27, 28, 29, 30, 31, 32, 33, 35, 36, 39, 41, 42, 43, 44,
    45,
];

/// socketcall's call number for socket(2).
const SYS_SOCKET: u64 = 1;

/// clone flags that create namespaces; without CAP_SYS_ADMIN none may be set.
const CLONE_NAMESPACES: u64 = 0x7e02_0000;

fn rule(names: &[&str], action: LinuxSeccompAction, args: Vec<LinuxSeccompArg>) -> LinuxSyscall {
    let mut s = LinuxSyscall::default();
    s.set_names(names.iter().map(|n| n.to_string()).collect());
    s.set_action(action);
    if !args.is_empty() {
        s.set_args(Some(args));
    }
    s
}

fn arg(
    index: usize,
    value: u64,
    value_two: Option<u64>,
    op: LinuxSeccompOperator,
) -> LinuxSeccompArg {
    let mut b = LinuxSeccompArgBuilder::default()
        .index(index)
        .value(value)
        .op(op);
    if let Some(v) = value_two {
        b = b.value_two(v);
    }
    // Every field has a default, so building cannot fail.
    b.build().unwrap_or_default()
}

/// The RuntimeDefault profile for a container whose bounding set is `bounding` (names without
/// `CAP_`).
pub fn runtime_default(bounding: &[String]) -> LinuxSeccomp {
    let has = |c: &str| bounding.iter().any(|b| b == c);
    let allow = LinuxSeccompAction::ScmpActAllow;
    let mut rules = vec![rule(ALLOWED, allow, vec![])];
    rules.push(rule(
        &["socket"],
        allow,
        vec![arg(0, 12, None, LinuxSeccompOperator::ScmpCmpLt)],
    ));
    for f in SOCKET_FAMILIES {
        rules.push(rule(
            &["socket"],
            allow,
            vec![arg(0, f, None, LinuxSeccompOperator::ScmpCmpEq)],
        ));
    }
    // i386's socketcall multiplexes the socket calls with their arguments in memory, out of a
    // filter's reach: its SYS_SOCKET (1) would make any family, AF_ALG too ("Copy Fail",
    // CVE-2026-31431). Every other call through it stays; i386 programs make sockets with
    // socket(2) itself (Linux 4.3 and later), which the family rules above filter.
    rules.push(rule(
        &["socketcall"],
        allow,
        vec![arg(0, SYS_SOCKET, None, LinuxSeccompOperator::ScmpCmpNe)],
    ));
    for p in PERSONAS {
        rules.push(rule(
            &["personality"],
            allow,
            vec![arg(0, p, None, LinuxSeccompOperator::ScmpCmpEq)],
        ));
    }
    for (cap, names) in BY_CAPABILITY {
        if has(cap) {
            rules.push(rule(names, allow, vec![]));
        }
    }
    if !has("SYS_ADMIN") {
        rules.push(rule(
            &["clone"],
            allow,
            vec![arg(
                0,
                CLONE_NAMESPACES,
                Some(0),
                LinuxSeccompOperator::ScmpCmpMaskedEq,
            )],
        ));
        // clone3's flags are out of reach in memory: ENOSYS makes libc fall back to clone.
        let mut c3 = rule(&["clone3"], LinuxSeccompAction::ScmpActErrno, vec![]);
        c3.set_errno_ret(Some(libc::ENOSYS as u32));
        rules.push(c3);
    }
    let mut p = LinuxSeccomp::default();
    p.set_default_action(LinuxSeccompAction::ScmpActErrno);
    p.set_default_errno_ret(Some(libc::EPERM as u32));
    p.set_architectures(Some(if std::env::consts::ARCH == "aarch64" {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    }));
    p.set_syscalls(Some(rules));
    p
}
