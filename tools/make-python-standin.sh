#!/usr/bin/env bash
# Give a CANN stand-in the base's own Python, for releases whose venv is made on the base's python3 and
# whose base ships another Python than the stand-in's 3.11 (verl_pt210_cann910: cann:9.1.0-…-py3.12).
# The real CANN base images build their Python from source (Ascend/cann-container-image, e.g.
# cann/8.5.0-a3-ubuntu22.04-py3.11/Dockerfile: `./configure --enable-shared LDFLAGS="-Wl,-rpath
# /usr/local/python3.11.14/lib" --prefix=/usr/local/python3.11.14`, `make altinstall`, python3/python/pip3/pip
# links, that bin first on PATH); so does this, into /usr/local/python<VERSION>, from the CPython source
# Ubuntu ships (python.org and Huawei's mirror of it do not resolve from here; archive.ubuntu.com does):
# the orig tarball of the package, checked against the sha256 its Sources index gives.
#   linux/amd64: compiled natively in a container of the (Ubuntu 22.04) stand-in itself;
#   linux/arm64: cross-compiled for aarch64 in an amd64 Debian 12 container (native speed; compiling
#                under QEMU would take hours here), for the Debian 12 arm64 stand-in.
# The stand-in layer then adds the runtime libraries, runs ensurepip and imports ssl, ctypes, sqlite3, …
# (under emulation for arm64). /usr/local/bin/python3 and python point at it too (they pointed at the
# stand-in OS's 3.11), so no PATH reaches the other Python by `python3`.
#   tools/make-python-standin.sh [--platform linux/amd64|linux/arm64] VERSION BASE_IMAGE IMAGE
#   e.g. tools/make-python-standin.sh --platform linux/arm64 3.12 \
#            rlbox/cann-standin:9.1.0-a3-debian12-py3.11-arm64 rlbox/cann-standin:9.1.0-a3-debian12-py3.11-cpython3.12-arm64
# Idempotent (does nothing if IMAGE exists). Needs Docker, for arm64 the emulation (its last layer's RUN)
# and the amd64 base rlbox/debian:bookworm (tools/make-base-image.sh), and network for apt and the source.
set -euo pipefail
usage() { echo "usage: $0 [--platform linux/amd64|linux/arm64] VERSION BASE_IMAGE IMAGE" >&2; exit 2; }
platform=linux/amd64
if [ "${1:-}" = --platform ]; then [ $# -ge 2 ] || usage; platform=$2; shift 2; fi
[ $# -eq 3 ] || usage
version=$1 base=$2 image=$3
ubuntu=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
case "$version" in
3.12)  # noble-updates' python3.12 (dists/noble-updates/main/source/Sources: Checksums-Sha256)
    full=3.12.3 series=noble pkg_version=3.12.3-1ubuntu0.17
    orig_sha=56bfef1fdfc1221ce6720e43a661e3eb41785dd914ce99698d8c7896af4bdaa1 ;;
*) echo "no source known for Python $version (known: 3.12)" >&2; exit 2 ;;
esac
case "$platform" in linux/amd64) cross= ;; linux/arm64) cross=aarch64-linux-gnu ;; *) echo "unsupported platform '$platform'" >&2; exit 2 ;; esac
orig=python${version}_$full.orig.tar.xz
prefix=/usr/local/python$full
builder=rlbox/cpython-build:$full-${platform#linux/}

if docker image inspect "$image" >/dev/null 2>&1; then echo "$image already present"; exit 0; fi
docker image inspect "$base" >/dev/null 2>&1 || { echo "no base image $base (tools/make-cann-standin.sh makes it)" >&2; exit 1; }
work=$(mktemp -d /tmp/rlbox-python.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "fetching $orig (Ubuntu $series's python$version $pkg_version source)"
mkdir -p "$work/build"
curl -fsSL -o "$work/build/$orig" "$ubuntu/pool/main/p/python$version/$orig"
echo "$orig_sha  $work/build/$orig" | sha256sum -c --quiet -

# The flags CANN's base images configure with; the rpath makes LD_LIBRARY_PATH optional.
configure_flags="--prefix=$prefix --enable-shared LDFLAGS=-Wl,-rpath,$prefix/lib --with-ensurepip=no"
dev_libs="libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev libncurses-dev uuid-dev libgdbm-dev libexpat1-dev"
if [ -z "$cross" ]; then
    cat > "$work/build/Dockerfile" <<EOF
FROM $base
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 \\
      build-essential xz-utils pkg-config $dev_libs >/dev/null && rm -rf /var/lib/apt/lists/*
COPY $orig /src/
WORKDIR /src
RUN tar xf $orig && cd Python-$full && ./configure -q $configure_flags >/dev/null \\
 && make -s -j"\$(nproc)" >/dev/null 2>make.err || { tail -40 make.err; exit 1; } \\
 && make -s altinstall DESTDIR=/out >/dev/null 2>&1
EOF
else
    arm_libs=$(for l in $dev_libs; do printf '%s:arm64 ' "$l"; done)
    cat > "$work/build/Dockerfile" <<EOF
FROM rlbox/debian:bookworm
RUN dpkg --add-architecture arm64 && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \\
      --no-install-recommends -o Dpkg::Use-Pty=0 build-essential gcc-$cross libc6-dev-arm64-cross \\
      xz-utils pkg-config zlib1g-dev libssl-dev libffi-dev $arm_libs >/dev/null && rm -rf /var/lib/apt/lists/*
COPY $orig /src/
WORKDIR /src
# A Python $version for the build machine (a cross build runs it: --with-build-python), then the aarch64 one.
RUN tar xf $orig && mv Python-$full py && mkdir build-host && cd build-host \\
 && ../py/configure -q --prefix=/opt/build-python --without-ensurepip >/dev/null \\
 && make -s -j"\$(nproc)" >/dev/null 2>&1 && make -s install >/dev/null 2>&1 && /opt/build-python/bin/python$version -V
RUN mkdir build-aarch64 && cd build-aarch64 \\
 && printf 'ac_cv_file__dev_ptmx=yes\nac_cv_file__dev_ptc=no\nac_cv_buggy_getaddrinfo=no\n' > config.site \\
 && env CONFIG_SITE=\$PWD/config.site PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig \\
      ../py/configure -q --host=$cross --build=x86_64-linux-gnu --with-build-python=/opt/build-python/bin/python$version \\
      --enable-ipv6 $configure_flags >/dev/null \\
 && make -s -j"\$(nproc)" >/dev/null 2>make.err || { tail -40 make.err; exit 1; } \\
 && make -s altinstall DESTDIR=/out >/dev/null 2>&1
EOF
fi
echo "building CPython $full for $platform in $builder (several minutes)"
docker build -q --network host --platform linux/amd64 -t "$builder" "$work/build" >/dev/null
cid=$(docker create --platform linux/amd64 "$builder")
mkdir -p "$work/ctx"
docker cp "$cid:/out$prefix" "$work/ctx/python" >/dev/null
docker rm "$cid" >/dev/null

what="CPython $full in $prefix, built from source as CANN's base images build theirs (--enable-shared, rpath), from Ubuntu $series's python$version $pkg_version orig tarball${cross:+, cross-compiled for aarch64}; the stand-in's python3"
cat > "$work/ctx/Dockerfile" <<EOF
FROM $base
COPY python/ $prefix/
ENV PATH=$prefix/bin:\$PATH LD_LIBRARY_PATH=$prefix/lib
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 \\
      libssl3 libffi8 zlib1g libbz2-1.0 liblzma5 libsqlite3-0 libreadline8 libncursesw6 libuuid1 libgdbm6 libexpat1 >/dev/null \\
 && rm -rf /var/lib/apt/lists/* \\
 && $prefix/bin/python$version -m ensurepip --altinstall >/dev/null \\
 && ln -sf python$version $prefix/bin/python3 && ln -sf python3 $prefix/bin/python \\
 && ln -sf pip$version $prefix/bin/pip3 && ln -sf pip3 $prefix/bin/pip \\
 && for n in python3 python pip3 pip; do ln -sf $prefix/bin/\$n /usr/local/bin/\$n; done \\
 && python3 -c 'import ssl, ctypes, sqlite3, lzma, bz2, zlib, readline, uuid, venv, ensurepip, sys; print(sys.version)' \\
 && test "\$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = $version \\
 && find $prefix -name __pycache__ -type d -prune -exec rm -rf {} + \\
 && printf '%s\n' "$what." >> /etc/rlbox-cann-standin
LABEL io.rlbox.standin.python="$what"
EOF
echo "adding it to $base -> $image ($platform${cross:+, under emulation})"
docker build -q --network host --platform "$platform" -t "$image" "$work/ctx" >/dev/null
echo "made $image"
