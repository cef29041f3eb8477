#!/usr/bin/env bash
# Builds wolfSSL from Debian's source package with DTLS 1.3 connection IDs,
# and the two test peers (cidserver, cidclient, linked statically) against
# it, into
#   ${CIDROUTE_PEERS:-$HOME/.cache/cidroute/peers}/wolfssl-<version>-<hash>/bin
# where <hash> covers this script and the peers' sources. A complete
# directory is the cache: a second run does nothing. The library is kept
# in wolfssl-<version>-lib-<hash of this script>/, so that a change to the
# peers' C rebuilds them in seconds, not the library in minutes. The last
# line of stdout is the peers' directory; `build.sh --dir` only prints it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

version=5.5.4
# The files whose change means a new build, in a fixed order.
sources=(build.sh cidpeer.h cidserver.c cidclient.c)
hash=$(cd "$here" && cat "${sources[@]}" | sha256sum | cut -c1-12)
root=${CIDROUTE_PEERS:-$HOME/.cache/cidroute/peers}
dest=$root/wolfssl-$version-$hash
lib=$root/wolfssl-$version-lib-$(sha256sum <"$here/build.sh" | cut -c1-12)

if [ "${1:-}" = --dir ]; then
	echo "$dest"
	exit 0
fi
if [ -e "$dest/complete" ]; then
	echo "$dest"
	exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

build_lib() {
	# Source lists: Debian's deb822 file for the binary archive, mirrored
	# as deb-src, unless some list already names a source archive.
	local fresh=
	if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
		[ -e /etc/apt/sources.list.d/debian.sources ] || {
			echo "build.sh: no deb-src list and no /etc/apt/sources.list.d/debian.sources to mirror" >&2
			exit 1
		}
		sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
			as_root tee /etc/apt/sources.list.d/debian-src.sources >/dev/null
		fresh=1
	fi

	# Build tools: the tarball has no configure script, so autotools run.
	local need=() t
	for t in gcc:gcc make:make autoreconf:autoconf automake:automake libtoolize:libtool dpkg-source:dpkg-dev xz:xz-utils; do
		command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
	done
	if [ ${#need[@]} -gt 0 ] || [ -n "$fresh" ] || [ -z "$(apt-cache showsrc wolfssl 2>/dev/null)" ]; then
		as_root apt-get update -qq
	fi
	if [ ${#need[@]} -gt 0 ]; then
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
	fi

	local work src got debver
	work=$(mktemp -d "$root/wolfssl-build.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	cd "$work"
	apt-get source -qq wolfssl >/dev/null 2>apt-source.log || { cat apt-source.log >&2; exit 1; }
	src=$(echo wolfssl-*/)
	got=${src#wolfssl-}
	got=${got%/}
	if [ "$got" != "$version" ]; then
		echo "build.sh: apt-get source gave wolfssl $got, this script is for $version" >&2
		exit 1
	fi
	debver=$(sed -n '1s/.*(\(.*\)).*/\1/p' "$src/debian/changelog")

	cd "$src"
	# DTLS_CID_MAX_SIZE: 2 by default, and a service's CIDs are longer (8
	# by default); RFC 9146 allows 255. DEBUG_WOLFSSL: the peers' -v flag.
	./autogen.sh >"$work/autogen.log" 2>&1 || { cat "$work/autogen.log" >&2; exit 1; }
	rm -rf "$lib"
	./configure -q --prefix="$lib" --disable-shared --enable-static \
		--enable-dtls --enable-dtls13 --enable-dtlscid \
		--disable-examples --disable-crypttests --disable-benchmark \
		CFLAGS="-O1 -DDTLS_CID_MAX_SIZE=255 -DDEBUG_WOLFSSL" >"$work/configure.log" 2>&1 ||
		{ cat "$work/configure.log" >&2; exit 1; }
	make -s -j"$(nproc)" install >"$work/make.log" 2>&1 || { tail -50 "$work/make.log" >&2; exit 1; }
	echo "wolfssl $debver" >"$lib/VERSION"
	touch "$lib/complete"
	cd "$root"
	rm -rf "$work"
	trap - EXIT
}

mkdir -p "$root"
if [ ! -e "$lib/complete" ]; then
	build_lib
fi

mkdir -p "$dest/bin"
for p in cidserver cidclient; do
	gcc -O1 -Wall -Wextra -Werror -I"$lib/include" -I"$here" -o "$dest/bin/$p" "$here/$p.c" \
		"$lib/lib/libwolfssl.a" -lm -lpthread
done
cp "$lib/VERSION" "$dest/VERSION"
touch "$dest/complete"
echo "$dest"
