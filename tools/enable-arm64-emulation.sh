#!/usr/bin/env bash
# Let this machine build and run linux/arm64 images under emulation (QEMU user mode), where it can:
# binfmt_misc mounted, Debian's qemu-user-static (+ binfmt-support) installed, and aarch64 registered
# with the F flag (the interpreter is opened at registration, so BuildKit's RUN steps and
# `docker run --platform linux/arm64` find it inside any container). Idempotent; needs root.
# Says in one line why not where it cannot, and exits 0 then (a machine without emulation still
# builds its own platform; `rlbox build` of an arm64 variant then stops and names what is missing).
# Does nothing on an arm64 machine. Used by `make arm64-emulation` (and so by `make setup`).
set -euo pipefail
say() { echo "arm64 emulation: $*" >&2; }
entry=/proc/sys/fs/binfmt_misc/qemu-aarch64

case "$(uname -m)" in
aarch64|arm64) say "not needed (this machine is arm64)"; exit 0 ;;
esac
has_f() { [ -r "$entry" ] && grep -q '^enabled' "$entry" && grep -Eq '^flags: *[A-Z]*F' "$entry"; }
if has_f; then
    say "ready (qemu-aarch64 registered with flags $(sed -n 's/^flags: *//p' "$entry"))"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not enabled: needs root (run: sudo $0)"; exit 0
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    if ! mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null; then
        say "not enabled: cannot mount binfmt_misc (a container without CAP_SYS_ADMIN?); enable it on the host: apt-get install qemu-user-static binfmt-support"
        exit 0
    fi
fi
if [ ! -x /usr/bin/qemu-aarch64-static ] || ! command -v update-binfmts >/dev/null; then
    command -v apt-get >/dev/null || { say "not enabled: no apt-get here; install qemu-user-static and register qemu-aarch64 with the F flag"; exit 0; }
    say "installing qemu-user-static binfmt-support"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static binfmt-support >/dev/null
fi
if ! has_f; then
    # binfmt-support registers what qemu-user-static ships (/usr/share/binfmts/qemu-aarch64, flags OCF/F).
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
fi
if has_f; then
    say "ready (qemu-aarch64 registered with flags $(sed -n 's/^flags: *//p' "$entry"))"
else
    say "not enabled: qemu-aarch64 is not registered with the F flag ($(cat "$entry" 2>/dev/null | tr '\n' ' ' || echo 'no entry')); try: update-binfmts --enable qemu-aarch64"
fi
