#!/usr/bin/python3
"""An independent seccomp compiler for crius's tests: reads an OCI seccomp profile (JSON, as in a
runtime spec's linux.seccomp) on stdin and writes the classic BPF program libseccomp makes of it
for x86_64 (Debian's python3-seccomp) on stdout, as raw sock_filter records. crius's unit tests
run both programs over the same inputs and want the same answers.

Names libseccomp does not know are skipped, as runc and containerd do; with an argument, their
list is written there as JSON (the caller leaves their numbers out of its comparison)."""

import errno
import json
import sys

import seccomp

OPS = {
    "SCMP_CMP_EQ": seccomp.EQ,
    "SCMP_CMP_NE": seccomp.NE,
    "SCMP_CMP_LT": seccomp.LT,
    "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_GE": seccomp.GE,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}


def action(name, errno_ret):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno.EPERM if errno_ret is None else errno_ret)
    if name == "SCMP_ACT_KILL" or name == "SCMP_ACT_KILL_THREAD":
        return seccomp.KILL
    if name == "SCMP_ACT_KILL_PROCESS":
        return seccomp.KILL_PROCESS
    if name == "SCMP_ACT_TRAP":
        return seccomp.TRAP
    if name == "SCMP_ACT_LOG":
        return seccomp.LOG
    if name == "SCMP_ACT_TRACE":
        return seccomp.TRACE(errno.EPERM if errno_ret is None else errno_ret)
    raise SystemExit(f"unsupported action {name}")


def main():
    profile = json.load(sys.stdin)
    default = action(profile["defaultAction"], profile.get("defaultErrnoRet"))
    f = seccomp.SyscallFilter(default)
    # Only x86_64: the native architecture of the test machine.
    f.remove_arch(seccomp.Arch.NATIVE)
    f.add_arch(seccomp.Arch.X86_64)
    unknown = set()
    for rule in profile.get("syscalls") or []:
        act = action(rule["action"], rule.get("errnoRet"))
        if act == default:
            continue
        conds = rule.get("args") or []
        args = [
            seccomp.Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
            for a in conds
        ]
        # libseccomp ANDs the comparisons of one rule, but keeps only one per argument: a
        # rule comparing one argument twice becomes one rule per comparison, as runc does.
        indexes = [a["index"] for a in conds]
        if len(set(indexes)) < len(indexes):
            combos = [[a] for a in args]
        else:
            combos = [args]
        for name in rule["names"]:
            if seccomp.resolve_syscall(seccomp.Arch.X86_64, name) < 0:
                unknown.add(name)
                continue
            for c in combos:
                f.add_rule(act, name, *c)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            json.dump(sorted(unknown), out)
    sys.stdout.flush()
    f.export_bpf(sys.stdout)


if __name__ == "__main__":
    main()
