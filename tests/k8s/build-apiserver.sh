#!/usr/bin/env bash
# Builds (or reuses) kube-apiserver and kube-controller-manager from Debian bookworm's
# source package `kubernetes` (1.20.5+really1.20.2), offline, as Debian's rules do.
# The binaries are cached under $INPLACED_K8S_CACHE/<source package version>/bin
# (default /var/cache/inplaced-k8s), like the VM image: a cold build takes about 8
# minutes on two cores, a cached one nothing. Prints the bin directory as its last line.
#
# The source comes through apt's own client with a private deb-src list
# (-o Dir::Etc::SourceList=... -o Dir::State::Lists=...): the machine's apt sources are
# left alone. Go 1.18+ needs Debian's newer reflect2/json-iterator in place of the
# vendored ones (the vendored ones crash the apiserver on the first custom-resource
# request).
set -euo pipefail
cache=${INPLACED_K8S_CACHE:-/var/cache/inplaced-k8s}
export DEBIAN_FRONTEND=noninteractive
mkdir -p "$cache"

# etcd runs the tests' API server; installed when missing
command -v etcd >/dev/null || apt-get install -y -q etcd-server >/dev/null

apt_dir=$cache/apt; mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts"
cat > "$apt_dir/sources.list" <<'SRC'
deb-src http://deb.debian.org/debian bookworm main
SRC
opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/parts"
      -o "Dir::State::Lists=$apt_dir/lists")
# the version keys the cache; offline, the newest cached build is reused
if apt-get "${opts[@]}" update -q >/dev/null 2>&1; then
    ver=$(apt-cache "${opts[@]}" showsrc kubernetes | awk '/^Version:/ {print $2; exit}')
else
    ver=$(ls -1 "$cache" | grep -E '^[0-9]' | grep -v '^src-' | sort -V | tail -1 || true)
    [ -n "$ver" ] || { echo "build-apiserver: no network for apt and no cached build under $cache" >&2; exit 1; }
    echo "build-apiserver: apt unreachable, reusing the cached $ver" >&2
fi
out=$cache/$ver
if [ -x "$out/bin/kube-apiserver" ] && [ -x "$out/bin/kube-controller-manager" ]; then
    echo "$out/bin"; exit 0
fi

apt-get install -y -q golang-go rsync jq golang-github-modern-go-reflect2-dev \
    golang-github-json-iterator-go-dev >/dev/null
src=$cache/src-$ver; rm -rf "$src"; mkdir -p "$src"; cd "$src"
apt-get "${opts[@]}" source --download-only kubernetes >/dev/null
dpkg-source -x kubernetes_*.dsc tree >/dev/null
cd tree
rm -rf vendor/github.com/modern-go/reflect2 vendor/github.com/json-iterator/go
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/json-iterator/go vendor/github.com/json-iterator/go
export GO111MODULE=off GOFLAGS=-mod=vendor GOCACHE=$cache/gocache GOPROXY=off
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
export KUBE_GIT_COMMIT=debian KUBE_BUILD_PLATFORMS=linux/amd64
make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >&2
mkdir -p "$out/bin.tmp"
cp _output/local/go/bin/kube-apiserver _output/local/go/bin/kube-controller-manager "$out/bin.tmp/" 2>/dev/null \
  || cp _output/bin/kube-apiserver _output/bin/kube-controller-manager "$out/bin.tmp/"
"$out/bin.tmp/kube-apiserver" --version >&2
mv "$out/bin.tmp" "$out/bin"
rm -rf "$src"
echo "$out/bin"
