#!/usr/bin/env bash
# Make a local STAND-IN for the CANN base images (quay.io/ascend/cann:<ver>-<chip>-ubuntu22.04-py3.11),
# without any registry, so the real Dockerfiles can be rehearsed (FROM, apt, venv, pip, the
# set_env.sh snapshot) on a machine that cannot pull them. It is NOT CANN: what is real is the
# OS (debootstrapped) and Python 3.11 as python3 with venv and pip; what is absent is every CANN
# binary, compiler, kernel and driver library. The /usr/local/Ascend tree holds only empty
# directories and set_env.sh scripts exporting the same variables as the real ones. The image says
# so in /etc/rlbox-cann-standin and its io.rlbox.standin label.
#   tools/make-cann-standin.sh [--platform linux/amd64|linux/arm64] [--os ubuntu22.04|debian12] [--for REAL_IMAGE] CANN_VERSION [IMAGE]
#   e.g. tools/make-cann-standin.sh 8.3.RC1  ->  rlbox/cann-standin:8.3.rc1-910b-ubuntu22.04-py3.11
# The OS: Ubuntu 22.04 (jammy, as the real base) by default; for linux/arm64 the default is Debian 12
# (bookworm, whose Python is 3.11), because Ubuntu's arm64 archive (ports.ubuntu.com) is not
# reachable from every build machine; `--os ubuntu22.04` takes Ubuntu's where it is. What differs
# between the two for the real Dockerfiles is handled here, not in them (see debian_fixups).
# Another architecture than the host's runs under emulation (tools/enable-arm64-emulation.sh):
# debootstrap's second stage and every RUN go through qemu-user-static.
# Two steps, each idempotent: the version-independent rootfs is debootstrapped once and
# imported (a FROM-scratch build of its tarball) as $CANN_STANDIN_ROOTFS (default rlbox/cann-standin:rootfs-OS-py3.11[-ARCH]);
# each CANN version is then a small layer FROM it (a local image: no registry) that adds the
# stand-in /usr/local/Ascend tree named for that version. Does nothing if IMAGE already exists.
# Needs root, debootstrap, curl and Docker (BuildKit or the classic builder).
# Env: UBUNTU_MIRROR (default archive.ubuntu.com, ports.ubuntu.com for non-amd64), DEBIAN_MIRROR.
set -euo pipefail

usage() { echo "usage: $0 [--platform linux/amd64|linux/arm64] [--os ubuntu22.04|debian12] [--for REAL_IMAGE] CANN_VERSION [IMAGE]   (e.g. $0 8.3.RC1)" >&2; exit 2; }
hostarch=$(dpkg --print-architecture)
debarch=$hostarch
os=
real=
while [ $# -gt 0 ]; do
    case "$1" in
    --platform) [ $# -ge 2 ] || usage
        case "$2" in linux/amd64) debarch=amd64 ;; linux/arm64) debarch=arm64 ;; *) echo "unsupported platform '$2'" >&2; exit 2 ;; esac
        shift 2 ;;
    --os) [ $# -ge 2 ] || usage; os=$2; shift 2 ;;
    --for) [ $# -ge 2 ] || usage; real=$2; shift 2 ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] && [ $# -le 2 ] || usage
os=${os:-$([ "$debarch" = arm64 ] && echo debian12 || echo ubuntu22.04)}
case "$os" in ubuntu22.04|debian12) ;; *) echo "unsupported stand-in OS '$os' (ubuntu22.04 or debian12)" >&2; exit 2 ;; esac
version=$1
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9A-Za-z.]+$ ]] || { echo "bad CANN version '$version' (want e.g. 8.3.RC1)" >&2; exit 2; }
case "$debarch" in amd64) march=x86_64 ;; arm64) march=aarch64 ;; esac
platform=linux/$debarch
suffix=; [ "$debarch" = amd64 ] || suffix=-$debarch
image=${2:-rlbox/cann-standin:${version,,}-910b-$os-py3.11$suffix}
rootfs_image=${CANN_STANDIN_ROOTFS:-rlbox/cann-standin:rootfs-$os-py3.11$suffix}
if [ "$os" = debian12 ]; then os_name="Debian 12 (bookworm)"; else os_name="Ubuntu 22.04 (jammy)"; fi

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "CANN stand-in $image already present"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap, chroot)" >&2; exit 1; }
if [ "$debarch" != "$hostarch" ] && ! grep -qs '^enabled' "/proc/sys/fs/binfmt_misc/qemu-$march"; then
    echo "no $platform emulation on this $hostarch machine: run tools/enable-arm64-emulation.sh (qemu-user-static, binfmt_misc)" >&2
    exit 1
fi
if [ "$debarch" = amd64 ]; then
    mirror=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
else
    mirror=${UBUNTU_MIRROR:-http://ports.ubuntu.com/ubuntu-ports}
fi
debian_mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d /tmp/rlbox-cann-standin.XXXXXX)
rootfs=$work/rootfs
cleanup() {
    if mountpoint -q "$rootfs/proc" 2>/dev/null; then umount "$rootfs/proc" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# ---- 1. The rootfs image: the OS + Python 3.11 (independent of the CANN version)
in_root() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

debootstrap_ubuntu() {
    # debootstrap checks jammy's Release signature with Ubuntu's archive key (never --no-check-gpg).
    local keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg
    if [ ! -s "$keyring" ]; then
        apt-get install -y -q ubuntu-keyring >/dev/null 2>&1 || true   # not in Debian bookworm
    fi
    if [ ! -s "$keyring" ]; then
        # Fetch jammy's ubuntu-keyring .deb over https, check it against a pinned SHA-256 and
        # take the keyring out of it without installing it on the host.
        local deb=ubuntu-keyring_2021.03.26_all.deb
        local sha=0d0e7ed6b112f5d03eabf3c7eb01ebdacf9c57714b279e90495cfc58c8c4520f
        echo "fetching Ubuntu's archive keyring ($deb)"
        curl -fsSL -o "$work/$deb" "https://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/$deb"
        echo "$sha  $work/$deb" | sha256sum -c --quiet -
        dpkg -x "$work/$deb" "$work/keyring"
        keyring=$work/keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg
    fi

    echo "debootstrap jammy ($debarch) into $rootfs (a few minutes)"
    debootstrap --variant=minbase --arch="$debarch" --components=main,universe \
        --keyring="$keyring" --include=ca-certificates jammy "$rootfs" "$mirror" >/dev/null

    cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror jammy main universe
deb $mirror jammy-updates main universe
deb $mirror jammy-security main universe
EOF
    # Python 3.11 comes from jammy-updates (universe); jammy's own python3 (3.10) is not installed.
    python_from="jammy-updates"
}

debootstrap_debian() {
    # Checked with Debian's archive keyring (debian-archive-keyring, on every Debian host).
    echo "debootstrap bookworm ($debarch) into $rootfs (a few minutes; longer under emulation)"
    debootstrap --variant=minbase --arch="$debarch" --include=ca-certificates bookworm "$rootfs" "$debian_mirror" >/dev/null
    cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $debian_mirror bookworm main
deb $debian_mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    python_from="bookworm"
}

# Where Debian 12 differs from Ubuntu 22.04 in what the real Dockerfiles touch, the stand-in
# makes it look like the real base (the Dockerfiles stay as they are for the real image):
# - Debian marks its Python "externally managed" (PEP 668): pip then refuses to install into the
#   system Python, which the real base (CANN's own Python in /usr/local) allows. The marker goes.
# - Every apt package the images install (images/defaults.yaml system_packages, libjemalloc2) has
#   the same name in bookworm, and libjemalloc lands in the same multiarch path
#   (/usr/lib/<triplet>/libjemalloc.so.2): nothing to map.
# - /etc/os-release says Debian 12 (true): offline builds read their OS packages from the source
#   cache's debs/<arch>/debian12, which `rlbox rehearse` fills from this base.
debian_fixups() {
    rm -f "$rootfs"/usr/lib/python3.11/EXTERNALLY-MANAGED
}

# The rootfs tarball in DIR/rootfs.tar becomes $rootfs_image for $platform.
import_rootfs() {
    cat > "$1/Dockerfile" <<EOF
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
LABEL io.rlbox.standin="rootfs of the rlbox CANN stand-ins: $os_name ($debarch) + Python 3.11, no CANN"
CMD ["/bin/bash"]
EOF
    docker build -q --network none --platform "$platform" -t "$rootfs_image" "$1" >/dev/null
    rm -f "$1/rootfs.tar"
}

make_rootfs_image() {
    command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
    if [ "$os" = debian12 ]; then debootstrap_debian; else debootstrap_ubuntu; fi
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    mount -t proc proc "$rootfs/proc" 2>/dev/null || echo "note: could not mount /proc in the chroot; continuing"
    in_root apt-get update -q >/dev/null
    in_root apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 \
        python3.11 python3.11-venv python3.11-dev >/dev/null
    [ "$os" != debian12 ] || debian_fixups
    # python3 / python3.11 / pip3 in /usr/local/bin, as the real base has them. Ubuntu and Debian
    # disable ensurepip for the system python, so pip is installed from the distribution's own pip
    # wheel (the one venv uses; no PyPI) by running pip out of that wheel: it lands in
    # /usr/local/lib/python3.11/dist-packages and /usr/local/bin/pip, pip3, pip3.11.
    ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python3.11"
    ln -sf python3.11 "$rootfs/usr/local/bin/python3"
    ln -sf python3.11 "$rootfs/usr/local/bin/python"
    in_root sh -c 'w=$(ls /usr/share/python-wheels/pip-*.whl) && python3.11 "$w/pip" install -q \
        --no-index --no-cache-dir --disable-pip-version-check "$w" 2>&1 | grep -v "as the .root. user" >&2 || true; \
        python3.11 -m pip --version >/dev/null'
    rm -f "$rootfs"/usr/local/bin/pip3.10   # jammy's wheel was installed by 3.10's pip; this one would run 3.11
    in_root python3.11 -m pip --version
    if mountpoint -q "$rootfs/proc"; then umount "$rootfs/proc"; fi

    # Small: no package caches, lists, docs or bytecode caches.
    in_root apt-get clean
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/debconf/*-old \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/root/.cache
    find "$rootfs" -xdev -name __pycache__ -type d -prune -exec rm -rf {} +
    : > "$rootfs/etc/resolv.conf"
    cat > "$rootfs/etc/rlbox-cann-standin" <<EOF
rlbox CANN stand-in rootfs ($debarch): $os_name, debootstrap minbase, with Python 3.11 from
$python_from as python3 (venv, pip). No CANN at all; the per-version stand-in images built
FROM it add a placeholder /usr/local/Ascend tree. Made by tools/make-cann-standin.sh.
EOF

    # A FROM-scratch build (not `docker import`, which records the engine's own architecture whatever
    # --platform says): the image's config names $platform, so BuildKit finds it locally for that platform.
    mkdir -p "$work/import"
    tar -C "$rootfs" --numeric-owner -c . > "$work/import/rootfs.tar"
    import_rootfs "$work/import"
    rm -rf "$rootfs"
    echo "made $rootfs_image"
}

if docker image inspect "$rootfs_image" >/dev/null 2>&1; then
    echo "rootfs image $rootfs_image already present"
else
    make_rootfs_image
fi

# ---- 2. The per-version image: the stand-in /usr/local/Ascend tree, marker and label
ctx=$work/ctx
toolkit=$ctx/usr/local/Ascend/ascend-toolkit
nnal=$ctx/usr/local/Ascend/nnal/atb
mkdir -p "$toolkit/$version"/{lib64,bin,opp,python/site-packages,compiler/ccec_compiler/bin,"$march-linux"/devlib} \
    "$nnal/$version"/atb/cxx_abi_{0,1}/{lib,bin} "$ctx/etc"
cat > "$toolkit/$version/ascend_toolkit_install.info" <<EOF
package_name=Ascend-cann-toolkit
version=$version
arch=$march
os=linux
path=/usr/local/Ascend/ascend-toolkit/$version
standin=rlbox: no CANN binaries
EOF
cp "$toolkit/$version/ascend_toolkit_install.info" "$toolkit/$version/$march-linux/ascend_toolkit_install.info"
cat > "$nnal/$version/version.info" <<EOF
version=$version
standin=rlbox: no CANN binaries
EOF

# Same variables and path entries as CANN 8.x's ascend-toolkit/set_env.sh, safe under `set -u`
# and adding no empty entries (an empty PATH/LD_LIBRARY_PATH/PYTHONPATH entry means the cwd).
cat > "$toolkit/set_env.sh" <<'EOF'
# rlbox CANN STAND-IN (see /etc/rlbox-cann-standin): the variables of the real
# ascend-toolkit/set_env.sh; the directories they name are empty.
export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest
export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${ASCEND_TOOLKIT_HOME}/lib64/plugin/opskernel:${ASCEND_TOOLKIT_HOME}/lib64/plugin/nnengine:${ASCEND_TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe/op_tiling/lib/linux/$(uname -m)${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/tools/aml/lib64:${ASCEND_TOOLKIT_HOME}/tools/aml/lib64/plugin:${LD_LIBRARY_PATH}
export PYTHONPATH=${ASCEND_TOOLKIT_HOME}/python/site-packages:${ASCEND_TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe${PYTHONPATH:+:${PYTHONPATH}}
export PATH=${ASCEND_TOOLKIT_HOME}/bin:${ASCEND_TOOLKIT_HOME}/compiler/ccec_compiler/bin:${ASCEND_TOOLKIT_HOME}/tools/ccec_compiler/bin${PATH:+:${PATH}}
export ASCEND_AICPU_PATH=${ASCEND_TOOLKIT_HOME}
export ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp
export TOOLCHAIN_HOME=${ASCEND_TOOLKIT_HOME}/toolkit
export ASCEND_HOME_PATH=${ASCEND_TOOLKIT_HOME}
EOF
# Same as nnal/atb/set_env.sh: ATB_HOME_PATH=.../atb/latest/atb/cxx_abi_<0|1>, the ABI from
# --cxx_abi=0|1 or else from the installed torch (1 without torch).
cat > "$nnal/set_env.sh" <<'EOF'
# rlbox CANN STAND-IN (see /etc/rlbox-cann-standin): the path variables of the real
# nnal/atb/set_env.sh; the directories they name are empty.
_rlbox_cxx_abi=
for _rlbox_arg in "$@"; do
    case "$_rlbox_arg" in --cxx_abi=0|--cxx_abi=1) _rlbox_cxx_abi=${_rlbox_arg#--cxx_abi=} ;; esac
done
if [ -z "$_rlbox_cxx_abi" ]; then
    case "$(python3 -c 'import torch; print(torch.compiled_with_cxx11_abi())' 2>/dev/null || true)" in
        False) _rlbox_cxx_abi=0 ;;
        *) _rlbox_cxx_abi=1 ;;
    esac
fi
export ATB_HOME_PATH=/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_${_rlbox_cxx_abi}
export LD_LIBRARY_PATH=${ATB_HOME_PATH}/lib:${ATB_HOME_PATH}/examples:${ATB_HOME_PATH}/tests/atbopstest${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
export PATH=${ATB_HOME_PATH}/bin${PATH:+:${PATH}}
unset _rlbox_cxx_abi _rlbox_arg
EOF

# Chip-independent by default (nothing in it is chip-specific): the A2 and A3 stand-ins of one CANN
# version are then the same image, and their rehearsals share every layer up to the first that differs.
real=${real:-quay.io/ascend/cann:${version,,}-<chip>-ubuntu22.04-py3.11 (any chip)}
standin_text="stand-in of $real for rlbox rehearsal builds: real $os_name ($debarch) and Python 3.11, NO CANN binaries, compilers or driver libraries"
cat > "$ctx/etc/rlbox-cann-standin" <<EOF
This image is an rlbox STAND-IN of $real, made by tools/make-cann-standin.sh
for rehearsal builds on machines that cannot pull the real image.
What is real: $os_name ($debarch; debootstrap minbase, with its apt sources) and Python 3.11
from the distribution's own packages as python3/python3.11 in /usr/local/bin, with venv and pip.
What is absent: every CANN binary, library, compiler (ccec), operator package, kernel
and driver library; /usr/local/Ascend (CANN $version) holds only empty directories, version files
and set_env.sh scripts that export the same variables as the real ones. Nothing built on it can
run on an NPU.
EOF

cat > "$ctx/Dockerfile" <<EOF
FROM $rootfs_image
COPY usr/ /usr/
COPY etc/ /etc/
RUN ln -sfn $version /usr/local/Ascend/ascend-toolkit/latest \\
 && ln -sfn $version /usr/local/Ascend/nnal/atb/latest
LABEL io.rlbox.standin="$standin_text" io.rlbox.cann="$version"
CMD ["/bin/bash"]
EOF
echo "building $image FROM $rootfs_image"
docker build -q --network none --platform "$platform" -t "$image" "$ctx" >/dev/null
echo "made $image  ($standin_text)"
