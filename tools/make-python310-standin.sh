#!/usr/bin/env bash
# Add CPython 3.10 to an arm64 CANN stand-in, for releases whose venv is Python 3.10
# (verl_pt27_25rc3: its Dockerfile installs Ubuntu 22.04's python3.10, python3.10-venv, python3.10-dev).
# No arm64 Python 3.10 package is reachable here (Debian 12 has 3.11 only; Ubuntu's arm64 archive does
# not resolve), so it is built from source: Ubuntu jammy's own python3.10 source (the orig tarball of
# the package jammy-updates ships, checked against the sha256 its Sources index gives), compiled for
# aarch64 with Debian's cross compiler in an amd64 container (native speed; compiling under QEMU would
# take hours here), installed as /usr/bin/python3.10 with its stdlib, headers and ensurepip's wheels.
# Three empty packages named python3.10, python3.10-venv and python3.10-dev (version
# <ubuntu version>+rlbox.standin) tell dpkg they are installed, so the real Dockerfile's
# `apt-get install python3.10 python3.10-venv python3.10-dev` finds them and changes nothing.
#   tools/make-python310-standin.sh BASE_IMAGE IMAGE
#   e.g. tools/make-python310-standin.sh rlbox/cann-standin:8.3.rc1-a3-debian12-py3.11-arm64 \
#            rlbox/cann-standin:8.3.rc1-a3-debian12-py3.11-cpython3.10-arm64
# Idempotent (does nothing if IMAGE exists). Needs Docker, arm64 emulation (the last layer's RUN), the
# amd64 base rlbox/debian:bookworm (tools/make-base-image.sh) and network for apt and the source.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BASE_IMAGE IMAGE" >&2; exit 2; }
base=$1 image=$2
ubuntu=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
# jammy-updates' python3.10 (dists/jammy-updates/main/source/Sources: Checksums-Sha256)
pkg_version=3.10.12-1~22.04.18
orig=python3.10_3.10.12.orig.tar.xz
orig_sha=afb74bf19130e7a47d10312c8f5e784f24e0527981eab68e20546cfb865830b8
builder=rlbox/cpython-cross:3.10.12-aarch64
epoch=1700000000  # the packages' file dates (any fixed value: only reproducibility matters)

if docker image inspect "$image" >/dev/null 2>&1; then echo "$image already present"; exit 0; fi
work=$(mktemp -d /tmp/rlbox-py310.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "fetching $orig (Ubuntu jammy-updates' python3.10 $pkg_version source)"
curl -fsSL -o "$work/$orig" "$ubuntu/pool/main/p/python3.10/$orig"
echo "$orig_sha  $work/$orig" | sha256sum -c --quiet -

# ---- 1. Cross-compile in an amd64 Debian 12 container (aarch64-linux-gnu-gcc, arm64 -dev libraries).
mkdir -p "$work/cross"
cp "$work/$orig" "$work/cross/"
cat > "$work/cross/Dockerfile" <<EOF
FROM rlbox/debian:bookworm
RUN dpkg --add-architecture arm64 && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \\
      --no-install-recommends -o Dpkg::Use-Pty=0 build-essential gcc-aarch64-linux-gnu libc6-dev-arm64-cross \\
      xz-utils pkg-config zlib1g-dev libssl-dev libffi-dev \\
      libssl-dev:arm64 zlib1g-dev:arm64 libffi-dev:arm64 libbz2-dev:arm64 liblzma-dev:arm64 libsqlite3-dev:arm64 \\
      libreadline-dev:arm64 libncurses-dev:arm64 uuid-dev:arm64 libgdbm-dev:arm64 libexpat1-dev:arm64 \\
 && rm -rf /var/lib/apt/lists/*
COPY $orig /src/
WORKDIR /src
# A Python 3.10 for the build machine (the cross build runs setup.py with it), then the aarch64 one.
RUN tar xf $orig && mv Python-3.10.12 py && mkdir build-host && cd build-host \\
 && ../py/configure -q --prefix=/opt/build-python --without-ensurepip >/dev/null \\
 && make -s -j"\$(nproc)" >/dev/null 2>&1 && make -s install >/dev/null 2>&1 && /opt/build-python/bin/python3.10 -V
RUN mkdir build-aarch64 && cd build-aarch64 \\
 && printf 'ac_cv_file__dev_ptmx=yes\nac_cv_file__dev_ptc=no\nac_cv_buggy_getaddrinfo=no\n' > config.site \\
 && env PATH=/opt/build-python/bin:\$PATH CONFIG_SITE=\$PWD/config.site \\
      PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig \\
      ../py/configure -q --host=aarch64-linux-gnu --build=x86_64-linux-gnu --prefix=/usr \\
      --enable-ipv6 --with-system-expat --with-ensurepip=no >/dev/null \\
 && env PATH=/opt/build-python/bin:\$PATH make -s -j"\$(nproc)" >/dev/null 2>make.err || { tail -40 make.err; exit 1; } \\
 && env PATH=/opt/build-python/bin:\$PATH make -s altinstall DESTDIR=/out >/dev/null 2>&1 \\
 && file /out/usr/bin/python3.10 2>/dev/null || true
# What setup.py could not build for aarch64 (it prints them): nothing the images need may be missing.
RUN cd build-aarch64 && ls /out/usr/lib/python3.10/lib-dynload/ | sed 's/\\..*//' | sort > /out/usr/lib/python3.10/rlbox-built-modules.txt
EOF
echo "cross-compiling CPython 3.10.12 for aarch64 in $builder (amd64; several minutes)"
docker build -q --network host -t "$builder" "$work/cross" >/dev/null
cid=$(docker create "$builder")
docker cp "$cid:/out" "$work/py310" >/dev/null
docker rm "$cid" >/dev/null

# ---- 2. The stand-in layer (arm64, under emulation): the runtime libraries, the tree, the packages.
docker image inspect "$base" >/dev/null 2>&1 || { echo "no base image $base (tools/make-cann-standin.sh makes it)" >&2; exit 1; }
ctx=$work/ctx
mkdir -p "$ctx/debs"
mv "$work/py310" "$ctx/py310"
for name in python3.10 python3.10-venv python3.10-dev; do
    d=$work/pkg-$name
    mkdir -p "$d/DEBIAN"
    cat > "$d/DEBIAN/control" <<EOF
Package: $name
Version: $pkg_version+rlbox.standin
Architecture: arm64
Maintainer: rlbox <rlbox@localhost>
Depends: libssl3, libffi8, zlib1g, libbz2-1.0, liblzma5, libsqlite3-0, libreadline8, libncursesw6, libuuid1, libgdbm6, libexpat1
Description: rlbox STAND-IN: CPython 3.10.12 built from source, not Ubuntu's package
 CPython 3.10.12 from Ubuntu jammy-updates' python3.10 $pkg_version source (orig tarball),
 cross-compiled for aarch64 by tools/make-python310-standin.sh and installed in /usr
 (/usr/bin/python3.10, /usr/lib/python3.10, /usr/include/python3.10). This package holds no
 files: it tells dpkg that what the real package provides is present.
EOF
    # Reproducible (fixed mtimes, SOURCE_DATE_EPOCH, root owner): the stand-ins of two chips made on
    # one base are then the same image, and the A2 and A3 rehearsals share their first layers.
    find "$d" -exec touch -h -d "@$epoch" {} +
    SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zgzip --build "$d" "$ctx/debs/$name.deb" >/dev/null
done
cat > "$ctx/Dockerfile" <<EOF
FROM $base
COPY py310/usr/ /usr/
COPY debs/ /tmp/rlbox-py310-debs/
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 \\
      libssl3 libffi8 zlib1g libbz2-1.0 liblzma5 libsqlite3-0 libreadline8 libncursesw6 libuuid1 libgdbm6 libexpat1 \\
 && dpkg -i /tmp/rlbox-py310-debs/*.deb && rm -rf /tmp/rlbox-py310-debs /var/lib/apt/lists/* \\
 && python3.10 -c 'import ssl, ctypes, sqlite3, lzma, bz2, zlib, readline, uuid, venv, ensurepip, sys; print(sys.version)' \\
 && printf '%s\n' "CPython 3.10.12 as /usr/bin/python3.10: built from Ubuntu jammy-updates' python3.10 $pkg_version source" \\
      "(cross-compiled for aarch64 by tools/make-python310-standin.sh), not Ubuntu's package; the packages python3.10," \\
      "python3.10-venv and python3.10-dev are empty stand-ins recording that it is there." >> /etc/rlbox-cann-standin
LABEL io.rlbox.standin.python310="CPython 3.10.12 from Ubuntu jammy's python3.10 $pkg_version source, cross-compiled for aarch64; not Ubuntu's package"
EOF
echo "adding it to $base -> $image (arm64, under emulation)"
docker build -q --network host --platform linux/arm64 -t "$image" "$ctx" >/dev/null
echo "made $image"
