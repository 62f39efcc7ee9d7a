#!/usr/bin/env bash
# Builds the OCI image of inplace-extension (the CAPI Runtime Extension that
# deploy/extension.yaml runs) without a registry, a base image or a container daemon:
#
#   bash packaging/image/build.sh            # -> <target-dir>/image/oci (OCI image layout)
#
# The image ("distroless" in the way Google's distroless images are made: Debian packages
# extracted, never installed, no package manager, no shell):
#   /usr/bin/inplace-extension   the release binary, linked against the packages' glibc
#                                baseline (2.28, cargo-zigbuild as in packaging/check.sh)
#   libc6, libgcc-s1, gcc-12-base, ca-certificates, netbase
#                                from this machine's Debian release (apt-get download,
#                                versions pinned by apt's cache), data files only:
#                                the dynamic loader, libc, libgcc_s, the CA bundle,
#                                /etc/services; no executables, no gconv, no docs but
#                                the copyright files
#   /var/lib/dpkg/status.d/<pkg> each package's control fields, where image scanners
#                                (trivy, grype) look for them in distroless images
#   /etc/passwd, /etc/group      root and nonroot (65532:65532), no login shell
#   /etc/nsswitch.conf           hosts: files dns (the resolver's templates use DNS)
# Config: user 65532:65532 (numeric, so the kubelet can enforce runAsNonRoot), entrypoint
# the binary, ports 9443 and 9090, OCI annotations and labels org.opencontainers.image.*
# (version, source, revision, created, licenses), io.inplaced.glibc-baseline and
# io.inplaced.base.packages (each Debian package=version in the root).
#
# Packed with umoci (Debian package umoci): it writes an OCI image layout from a plain
# directory and edits the config, with no daemon, no storage driver and no namespaces.
# buildah and podman keep images in containers/storage, which needs an overlay or vfs
# driver and (for buildah's RUN-free `buildah add`, still) user namespaces set up for the
# storage; skopeo only copies images. So umoci builds, skopeo pushes (README "The
# extension image"), runc runs the check (packaging/image/check.sh).
#
# Slow inputs are cached under /var/cache/inplaced-image, keyed by what they depend on:
# the .debs by package name and version (apt-get download). The binary comes from cargo
# (its own fingerprints). Environment: INPLACED_IMAGE_BIN (use this binary instead of
# building), INPLACED_IMAGE_SOURCE (the source label; default: git remote origin),
# SOURCE_DATE_EPOCH (timestamps; default: the last commit's).
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
cd "$(dirname "$0")/../.."

GLIBC_BASELINE=2.28
TRIPLE=x86_64-unknown-linux-gnu
ZIGLANG_VERSION=0.17.1
USER_ID=65532
PACKAGES=(libc6 libgcc-s1 gcc-12-base ca-certificates netbase)
CACHE=${INPLACED_IMAGE_CACHE:-/var/cache/inplaced-image}

say() { printf 'image: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

need_cmd() { # command package
    command -v "$1" >/dev/null && return
    [ "$(id -u)" -eq 0 ] || die "need $1 (Debian package $2): install it"
    say "apt-get install $2"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null; } ||
        die "apt-get install $2 failed"
}
need_cmd umoci umoci
need_cmd objdump binutils
need_cmd dpkg-deb dpkg
need_cmd python3 python3

target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || die "cannot find the cargo target directory"
version=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "inplaced"))')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || revision="$revision-dirty"
source_url=${INPLACED_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || echo "local checkout (set INPLACED_IMAGE_SOURCE)")}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# --- the binary: release, glibc baseline (the same build as packaging/check.sh)
bin=${INPLACED_IMAGE_BIN:-}
if [ -z "$bin" ]; then
    command -v cargo-zigbuild >/dev/null || cargo install --locked --quiet cargo-zigbuild@0.24.1
    zig_venv=$target_dir/zig-venv
    if ! "$zig_venv/bin/python" -m ziglang version 2>/dev/null | grep -qx "$ZIGLANG_VERSION"; then
        python3 -m venv "$zig_venv" >/dev/null 2>&1 || { need_cmd pip3 python3-venv; python3 -m venv "$zig_venv"; }
        "$zig_venv/bin/pip" install --quiet --disable-pip-version-check "ziglang==$ZIGLANG_VERSION" ||
            die "pip install ziglang failed"
    fi
    export CARGO_ZIGBUILD_PYTHON_PATH=$zig_venv/bin/python
    t0=$SECONDS
    say "cargo zigbuild --release --target $TRIPLE.$GLIBC_BASELINE --bin inplace-extension"
    cargo zigbuild --release --locked --quiet --target "$TRIPLE.$GLIBC_BASELINE" --bin inplace-extension ||
        die "release build failed"
    say "release build: $((SECONDS - t0)) s"
    bin=$target_dir/$TRIPLE/release/inplace-extension
fi
[ -x "$bin" ] || die "no binary at $bin"
need=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
[ "$(printf '%s\n%s\n' "$need" "$GLIBC_BASELINE" | sort -V | tail -1)" = "$GLIBC_BASELINE" ] ||
    die "$bin requires GLIBC_$need, above the baseline $GLIBC_BASELINE (build with cargo zigbuild)"

# --- the Debian packages, cached by name_version_arch.deb
mkdir -p "$CACHE/debs"
debs=()
pinned=()
for p in "${PACKAGES[@]}"; do
    v=$(apt-cache policy "$p" | sed -n 's/^  Candidate: //p')
    [ -n "$v" ] && [ "$v" != "(none)" ] || die "apt knows no candidate for $p (apt-get update?)"
    f=$(ls "$CACHE/debs/${p}_${v//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
    if [ -z "$f" ]; then
        say "apt-get download $p=$v"
        (cd "$CACHE/debs" && apt-get download -qq -o APT::Sandbox::User=root "$p=$v" >/dev/null) || die "apt-get download $p=$v failed"
        f=$(ls "$CACHE/debs/${p}_${v//:/%3a}_"*.deb | head -1)
    fi
    debs+=("$f")
    pinned+=("$p=$v")
done

# --- the root file system
work=$(mktemp -d -t inplaced-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root/var/lib/dpkg/status.d" "$root/etc" "$root/usr/bin" "$root/tmp"
for f in "${debs[@]}"; do
    dpkg-deb -x "$f" "$root"
    p=$(dpkg-deb -f "$f" Package)
    dpkg-deb -f "$f" > "$root/var/lib/dpkg/status.d/$p"
done
# data only: no executables (the packages' tools need a shell or are of no use), no
# gconv modules (iconv; Rust never calls it), no documentation but the copyright files
rm -rf "$root/usr/bin/"* "$root/usr/sbin" "$root/sbin" "$root/bin" \
    "$root/usr/lib/x86_64-linux-gnu/gconv" "$root/usr/share/lintian" "$root/usr/share/man" \
    "$root/usr/share/locale" "$root/usr/share/gcc" "$root/usr/lib/ssl" "$root/etc/ca-certificates" \
    "$root/usr/share/doc-base"
find "$root/usr/share/doc" -type f ! -name copyright -delete
find "$root/usr/share/doc" -type l -delete
# what ca-certificates' postinst (update-ca-certificates) would make: one PEM bundle
mkdir -p "$root/etc/ssl/certs"
cat "$root"/usr/share/ca-certificates/mozilla/*.crt > "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root/usr/share/ca-certificates"
cat > "$root/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:$USER_ID:$USER_ID:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$root/etc/group" <<EOF
root:x:0:
nonroot:x:$USER_ID:
EOF
echo 'hosts: files dns' > "$root/etc/nsswitch.conf"
mkdir -p "$root/home/nonroot" "$root/etc/inplace-extension"
chown "$USER_ID:$USER_ID" "$root/home/nonroot"
chmod 1777 "$root/tmp"
install -m 0755 "$bin" "$root/usr/bin/inplace-extension"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
[ ! -e "$root/bin/sh" ] && [ ! -e "$root/usr/bin/sh" ] || die "a shell got into the image"

# --- the image
out=$target_dir/image
rm -rf "$out"
mkdir -p "$out"
layout=$out/oci
ref="$layout:$version"
umoci init --layout "$layout"
umoci new --image "$ref"
umoci insert --image "$ref" --history.created "$created" --history.comment "root from Debian packages and inplace-extension $version" "$root" /
labels=(
    "org.opencontainers.image.title=inplace-extension"
    "org.opencontainers.image.description=Cluster API Runtime Extension for in-place updates of bare-metal nodes (inplaced)"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.source=$source_url"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.created=$created"
    "org.opencontainers.image.licenses=Apache-2.0"
    "io.inplaced.base.packages=${pinned[*]}"
    "io.inplaced.glibc-baseline=$GLIBC_BASELINE"
    "io.inplaced.glibc-required=$need"
)
cfg=(--image "$ref" --created "$created" --os linux --architecture amd64
    --config.user "$USER_ID:$USER_ID" --config.workingdir /
    --config.entrypoint /usr/bin/inplace-extension
    --config.cmd --config --config.cmd /etc/inplace-extension/config/config.toml
    --config.exposedports 9443/tcp --config.exposedports 9090/tcp
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
    --history.created "$created" --history.comment "user $USER_ID, entrypoint, labels")
for l in "${labels[@]}"; do cfg+=(--config.label "$l" --manifest.annotation "$l"); done
umoci config "${cfg[@]}"
umoci gc --layout "$layout"

# --- what was built
blobs=$(python3 - "$layout" "$version" <<'PY'
import json, sys, os
layout, tag = sys.argv[1], sys.argv[2]
blob = lambda d: os.path.join(layout, "blobs", *d.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
m = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
man = json.load(open(blob(m["digest"])))
layers = sum(l["size"] for l in man["layers"])
print(m["digest"], layers, layers + man["config"]["size"] + m["size"])
PY
)
read -r digest layers total <<<"$blobs"
unpacked=$(du -sb "$root" | cut -f1)
printf '%s\n' "$version" > "$out/tag"
say "built $ref ($digest)"
say "size: $((total / 1024)) KiB compressed (what a registry stores and a node pulls), $((unpacked / 1024)) KiB unpacked; binary $(( $(stat -c %s "$bin") / 1024 )) KiB, glibc needed $need (baseline $GLIBC_BASELINE)"
echo "image: $ref $digest compressed=$total unpacked=$unpacked"
