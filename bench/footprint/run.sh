#!/usr/bin/env bash
# Measures what a user's module gets from this library: for each case in
# testdata (a tiny main wiring a Watermill router or publisher with the
# dedup packages, and a baseline with the same wiring minus them) it runs
# `go mod tidy` in a scratch module outside the repository, on a fresh
# empty module cache, and reports the requirements, go.sum lines, modules
# and bytes downloaded, and the stripped binary size.
#
# The library comes from a file:// module proxy made here from a commit
# (HEAD by default), at that commit's pseudo-version, ahead of the usual
# proxy: the user's go.mod and go.sum are what `go get` of that commit
# would give, with no replace directive.
#
#	bench/footprint/run.sh [commit]   # the report on stdout
#
# FOOTPRINT_WITHOUT='router_example cmd' measures a what-if: those paths
# (globs, ** included) are removed from the commit's tree and go mod tidy
# run before the proxy serves it. FOOTPRINT_CASES='redis' measures only
# those cases; FOOTPRINT_VERBOSE=1 prints each go.mod and the zips
# downloaded; FOOTPRINT_KEEP=1 keeps the work directory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse "${1:-HEAD}")
work=$(mktemp -d "${TMPDIR:-/tmp}/footprint.XXXXXX")
upstream=$(go env GOPROXY)

if [ -n "${FOOTPRINT_KEEP:-}" ]; then echo "# work directory kept: $work" >&2; else trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT; fi

export GOTOOLCHAIN=local GOWORK=off GONOSUMDB=github.com/watermill-dedup/dedup
export GOFLAGS="-mod=mod -buildvcs=false"

# The helper that writes module zips, built with the machine's own cache.
mkdir -p "$work/mkzip"
cp "$here/testdata/mkzip/main.go" "$work/mkzip/"
(cd "$work/mkzip" && printf 'module mkzip\n\ngo 1.26.0\n' >go.mod &&
	go get golang.org/x/mod@v0.42.0 >/dev/null 2>&1 && go build -o mkzip .)

# The proxy: every module of the commit (the root and any nested one) at
# the commit's pseudo-version.
stamp=$(TZ=UTC git -C "$repo" log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd "$commit")
ctime=$(TZ=UTC git -C "$repo" log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd "$commit")
version="v0.0.0-$stamp-${commit:0:12}"
mkdir -p "$work/src" "$work/proxy"
git -C "$repo" archive "$commit" | tar -x -C "$work/src"
if [ -n "${FOOTPRINT_WITHOUT:-}" ]; then
	(
		cd "$work/src"
		shopt -s globstar nullglob
		# shellcheck disable=SC2086 # the globs are meant to expand here
		rm -rf -- $FOOTPRINT_WITHOUT
		GOFLAGS=-mod=mod go mod tidy 2>/dev/null
	)
fi
while IFS= read -r gomod; do
	dir=$(dirname "$gomod")
	path=$(awk '$1 == "module" { print $2; exit }' "$gomod")
	at="$work/proxy/$(printf '%s' "$path" | sed 's/[A-Z]/!\L&/g')/@v"
	mkdir -p "$at"
	cp "$gomod" "$at/$version.mod"
	printf '{"Version":"%s","Time":"%s"}\n' "$version" "$ctime" >"$at/$version.info"
	echo "$version" >>"$at/list"
	"$work/mkzip/mkzip" "$path" "$version" "$dir" "$at/$version.zip"
done < <(find "$work/src" -name go.mod -not -path '*/testdata/*' | sort)

echo "# footprint of github.com/watermill-dedup/dedup@$version ($(go version | awk '{print $3, $4}'))"
if [ -n "${FOOTPRINT_WITHOUT:-}" ]; then
	echo "# what-if: the commit without $FOOTPRINT_WITHOUT, after go mod tidy"
fi
echo "# proxy: file:// (this commit), then $upstream; GOFLAGS=$GOFLAGS; a fresh GOMODCACHE per row"
printf '%-16s %6s %6s %6s %7s %7s %10s %7s %10s\n' case require direct go.sum mods zips bytes pkgs binary
for case in ${FOOTPRINT_CASES:-redis postgres nats}; do
	for kind in baseline dedup; do
		d="$work/cases/$case-$kind"
		export GOMODCACHE="$work/modcache/$case-$kind"
		export GOPROXY="file://$work/proxy,$upstream"
		mkdir -p "$d" "$GOMODCACHE"
		cp "$here/testdata/$case/$kind/main.go" "$d/"
		printf 'module example.com/footprint/%s\n\ngo 1.26.0\n' "$case" >"$d/go.mod"
		(
			cd "$d"
			if [ "$kind" = dedup ]; then
				go get "github.com/watermill-dedup/dedup@$version" 2>/dev/null
			fi
			go mod tidy 2>/dev/null
			go build -trimpath -ldflags='-s -w' -o "$d/bin" .
		)
		# requirement lines: in a require block, or a one-line require
		require=$(awk '/^require \($/ { inb = 1; next } inb && /^\)/ { inb = 0 } inb && NF { n++ } /^require [^(]/ { n++ } END { print n + 0 }' "$d/go.mod")
		direct=$(awk '/^require \($/ { inb = 1; next } inb && /^\)/ { inb = 0 } inb && NF && !/\/\/ indirect/ { n++ } /^require [^(]/ && !/\/\/ indirect/ { n++ } END { print n + 0 }' "$d/go.mod")
		sum=$(wc -l <"$d/go.sum")
		dl="$GOMODCACHE/cache/download"
		mods=$(find "$dl" -path '*/@v/*.mod' | wc -l)
		zips=$(find "$dl" -path '*/@v/*.zip' | wc -l)
		bytes=$(find "$dl" -path '*/@v/*' -type f \( -name '*.mod' -o -name '*.zip' -o -name '*.info' \) -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
		pkgs=$(cd "$d" && go list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' . | grep -c .)
		binary=$(stat -c %s "$d/bin")
		printf '%-16s %6d %6d %6d %7d %7d %10d %7d %10d\n' "$case-$kind" "$require" "$direct" "$sum" "$mods" "$zips" "$bytes" "$pkgs" "$binary"
		if [ -n "${FOOTPRINT_VERBOSE:-}" ]; then
			sed 's/^/    go.mod: /' "$d/go.mod"
			find "$dl" -path '*/@v/*.zip' | sed "s|^$dl/||; s|/@v/| |; s|\.zip$||; s/^/    zip: /" | sort
		fi
	done
done
echo "# require: requirement lines go mod tidy wrote (direct: without // indirect); mods, zips: .mod files and"
echo "# module zips in the fresh module cache; bytes: their size with the .info files; pkgs: non-standard"
echo "# packages linked; binary: go build -trimpath -ldflags='-s -w', bytes"
