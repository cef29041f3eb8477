#!/usr/bin/env bash
# Builds the Mbed TLS interop peer of examples/e2e/mbedtls_test.go: Debian's
# mbedtls source package with rfc9146.patch (RFC 9146 record protection and
# extension number), connection IDs enabled, and ssl_client2, cidserver and
# cidclient linked against it.
#
# The result goes to $CIDROUTE_PEERS (default ~/.cache/cidroute/peers) as
# mbedtls-<version>-<hash of this directory's sources>/bin; when that
# directory exists, nothing is done, so CI can run this before every test
# run and keep the directory in its cache. Needs apt (it adds a deb-src
# list for the system's Debian suites when none is there) and runs apt as
# root, or through sudo.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=2.28.3 # the version rfc9146.patch is written against
peers=${CIDROUTE_PEERS:-$HOME/.cache/cidroute/peers}
# The same files in the same order as mbedtlsDir in examples/e2e.
hash=$(cd "$here" && cat build.sh rfc9146.patch peer.h cidserver.c cidclient.c | sha256sum | cut -c1-12)
dest=$peers/mbedtls-$version-$hash

if [ -x "$dest/bin/cidserver" ] && [ -x "$dest/bin/cidclient" ] && [ -x "$dest/bin/ssl_client2" ]; then
	echo "$dest (cached)"
	exit 0
fi

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Build tools: a C compiler, make, and dpkg-source for apt-get source.
need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v patch >/dev/null || need+=(patch)
updated=
if [ ${#need[@]} -gt 0 ]; then
	as_root apt-get update -qq
	updated=1
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Source lists: deb-src beside each deb entry of the Debian sources.
has_src() {
	grep -qsE '^[[:space:]]*deb-src[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list ||
		grep -qsE '^Types:.*deb-src' /etc/apt/sources.list.d/*.sources
}
if ! has_src; then
	src=/etc/apt/sources.list.d/cidroute-deb-src.sources
	if [ -e /etc/apt/sources.list.d/debian.sources ]; then
		sed 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources | as_root tee "$src" >/dev/null
	else
		# sources.list style: one deb-src line per deb line
		sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' /etc/apt/sources.list | as_root tee "${src%.sources}.list" >/dev/null
	fi
	updated=
fi

mkdir -p "$peers"
work=$(mktemp -d "$peers/.mbedtls-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get source -qq "mbedtls=$version-1" >/dev/null 2>&1 && ! apt-get source -qq mbedtls >/dev/null 2>&1; then
	[ -n "$updated" ] || as_root apt-get update -qq
	apt-get source -qq mbedtls >/dev/null
fi
srcdir=$work/mbedtls-$version
if [ ! -d "$srcdir" ]; then
	echo "apt-get source mbedtls gave $(ls -d mbedtls-*/), not $version: update rfc9146.patch and \$version" >&2
	exit 1
fi
cd "$srcdir"
patch -p1 --quiet --forward <"$here/rfc9146.patch"
sed -i 's|^//#define MBEDTLS_SSL_DTLS_CONNECTION_ID$|#define MBEDTLS_SSL_DTLS_CONNECTION_ID|' include/mbedtls/config.h
grep -q '^#define MBEDTLS_SSL_DTLS_CONNECTION_ID$' include/mbedtls/config.h

# -O1, and only the three libraries and ssl_client2: a test peer, built
# on CI machines with few cores.
# (Mbed TLS's makefiles echo each file; only errors are shown.) The
# programs step runs serially: in parallel, every test helper object
# starts its own make of tests/ and each is compiled twice.
jobs=$(nproc 2>/dev/null || echo 2)
make -s -j"$jobs" -C library CFLAGS=-O1 static >/dev/null
make -s -j1 -C programs CFLAGS=-O1 ssl/ssl_client2 >/dev/null
mkdir -p "$work/out/bin"
for p in cidserver cidclient; do
	cc -O1 -Wall -Wextra -Werror -Iinclude -o "$work/out/bin/$p" "$here/$p.c" \
		-Llibrary -lmbedtls -lmbedx509 -lmbedcrypto
done
cp programs/ssl/ssl_client2 "$work/out/bin/"
cp "$here/rfc9146.patch" "$work/out/"
# A complete directory or none: a build that failed or was cut leaves
# nothing under $dest.
rm -rf "$dest"
mv "$work/out" "$dest"
echo "$dest"
