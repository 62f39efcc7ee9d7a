#!/usr/bin/env bash
# Builds the release binaries against the glibc baseline (2.28: RHEL 8, Ubuntu 20.04,
# Debian 11 and every later release), the .deb (cargo-deb) and the .rpm
# (cargo-generate-rpm) from them, and checks their contents, the glibc symbol versions the
# binaries require, maintainer scripts and the systemd unit; then runs the example node's
# demo with the packaged binaries.
#
#   bash packaging/check.sh            # packages land in <target-dir>/packages/
#
# Why cargo-zigbuild: a binary linked here needs this machine's glibc (GLIBC_2.34 and up),
# and Rust's x86_64-unknown-linux-gnu target has no knob for an older glibc. Zig ships the
# stub libraries of every glibc version and links against the one named in the target
# suffix (`x86_64-unknown-linux-gnu.2.28`), with the Rust target already installed: no
# sysroot image, container or second toolchain. The alternatives were a build in a RHEL 8
# container (no container runtime or registry here) or musl (static, but a different libc
# for getaddrinfo/NSS and a slower allocator on the daemon's hot paths).
#
# Installs what it lacks itself (as root, on Debian/Ubuntu): dpkg-deb, rpm, objdump and
# systemd-analyze through apt-get; cargo-deb, cargo-generate-rpm and cargo-zigbuild through
# `cargo install --locked` at pinned versions; Zig from PyPI (`ziglang`, pinned) into a
# venv under the target directory. Prints `packaging: N passed, M failed` last and exits
# non-zero when anything failed.
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1
CARGO_ZIGBUILD_VERSION=0.24.1
ZIGLANG_VERSION=0.17.1
# the oldest glibc the packages support: RHEL 8 ships 2.28, Ubuntu 20.04 2.31, Debian 11 2.31
GLIBC_BASELINE=2.28
TRIPLE=x86_64-unknown-linux-gnu

say() { printf 'packaging: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------------------
# tools

apt_updated=
apt_install() {
    command -v apt-get >/dev/null || die "need $* but apt-get is not available: install it by hand"
    [ "$(id -u)" -eq 0 ] || die "need $* : run as root (apt-get install)"
    if [ -z "$apt_updated" ]; then
        say "apt-get update"
        apt-get update -qq || die "apt-get update failed"
        apt_updated=1
    fi
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        die "apt-get install $* failed"
}
need_cmd() { # command package
    command -v "$1" >/dev/null || apt_install "$2"
    command -v "$1" >/dev/null || die "$1 still missing after installing $2"
}
need_cmd dpkg-deb dpkg
need_cmd rpm rpm
need_cmd systemd-analyze systemd
need_cmd man man-db
need_cmd objdump binutils
need_cmd python3 python3

command -v cargo >/dev/null || die "cargo is required (Rust 1.95 or newer)"
need_cargo_tool() { # subcommand crate version
    # `cargo-<tool> --version` prints "cargo-<tool> X.Y.Z" for all three (cargo zigbuild
    # has no --version of its own); another version is replaced by the pinned one
    if ! "cargo-$1" --version 2>/dev/null | grep -qx "cargo-$1 $3"; then
        say "cargo install --locked $2@$3"
        local t0=$SECONDS
        cargo install --locked --quiet "$2@$3" || die "cargo install $2 failed"
        say "installed $2 in $((SECONDS - t0)) s"
    fi
}
need_cargo_tool deb cargo-deb "$CARGO_DEB_VERSION"
need_cargo_tool generate-rpm cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION"
need_cargo_tool zigbuild cargo-zigbuild "$CARGO_ZIGBUILD_VERSION"

# ---------------------------------------------------------------------------------------
# build

target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || die "cannot find the cargo target directory"
out=$target_dir/packages
rm -rf "$out"
mkdir -p "$out"

# Zig from PyPI, in a venv of its own (Debian's python3 refuses system-wide pip installs);
# cargo-zigbuild runs it as `python -m ziglang` through CARGO_ZIGBUILD_PYTHON_PATH.
zig_venv=$target_dir/zig-venv
if ! "$zig_venv/bin/python" -m ziglang version 2>/dev/null | grep -qx "${ZIGLANG_VERSION%%.post*}"; then
    python3 -m venv "$zig_venv" >/dev/null 2>&1 || { apt_install python3-venv; python3 -m venv "$zig_venv"; }
    say "pip install ziglang==$ZIGLANG_VERSION"
    "$zig_venv/bin/pip" install --quiet --disable-pip-version-check "ziglang==$ZIGLANG_VERSION" ||
        die "pip install ziglang failed"
fi
export CARGO_ZIGBUILD_PYTHON_PATH=$zig_venv/bin/python

t0=$SECONDS
# the `node` profile: the release profile with panic = "abort" (Cargo.toml says why)
say "cargo zigbuild --profile node --locked --target $TRIPLE.$GLIBC_BASELINE (inplaced, inplacectl)"
cargo zigbuild --profile node --locked --quiet --target "$TRIPLE.$GLIBC_BASELINE" --bin inplaced --bin inplacectl ||
    die "node build against glibc $GLIBC_BASELINE failed"
say "node build (glibc $GLIBC_BASELINE baseline): $((SECONDS - t0)) s"
bindir=$target_dir/$TRIPLE/node
# man pages and shell completions from the clap definitions (Cargo.toml's package assets);
# their text does not depend on the build, so the debug build the tests made serves
# into ./target/assets, where Cargo.toml's asset lists name them, also when
# CARGO_TARGET_DIR puts the build elsewhere (.ci/run does)
cargo run --locked --quiet --example gen-docs -- "target/assets" >/dev/null ||
    die "generating man pages and completions failed"

# cargo-deb and cargo-generate-rpm both map the assets' target/release/ to
# target/<triple>/<profile>/ when given --target and --profile
t0=$SECONDS
cargo deb --no-build --locked --profile node --target "$TRIPLE" --output "$out/" >/dev/null || die "cargo deb failed"
cargo generate-rpm --target-dir "$target_dir" --target "$TRIPLE" --profile node --output "$out/" || die "cargo generate-rpm failed"
say "packages: $((SECONDS - t0)) s"

debs=("$out"/*.deb)
rpms=("$out"/*.rpm)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || die "expected one .deb in $out"
[ ${#rpms[@]} -eq 1 ] && [ -f "${rpms[0]}" ] || die "expected one .rpm in $out"
deb=${debs[0]}
rpmf=${rpms[0]}
say "built $deb"
say "built $rpmf"

# ---------------------------------------------------------------------------------------
# checks

passed=0
failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1"; [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/     /'; }
# expect NAME TEXT REGEX: TEXT has a line matching the extended REGEX
expect() {
    if grep -Eq -- "$3" <<<"$2"; then ok "$1"; else fail "$1" "no line matches /$3/ in:
$2"; fi
}
# refuse NAME TEXT REGEX: no line of TEXT matches
refuse() {
    local hit
    if hit=$(grep -E -- "$3" <<<"$2"); then fail "$1" "unexpected: $hit"; else ok "$1"; fi
}

tmp=$(mktemp -d -t inplaced-packaging.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# --- .deb
deb_list=$(dpkg-deb -c "$deb")
for f in usr/bin/inplaced usr/bin/inplacectl; do
    expect "deb: $f, mode 0755" "$deb_list" "^-rwxr-xr-x (root/root|0/0) .* \./$f\$"
done
expect "deb: unit under usr/lib/systemd/system/" "$deb_list" ' \./usr/lib/systemd/system/inplaced\.service$'
expect "deb: tmpfiles.d entry" "$deb_list" ' \./usr/lib/tmpfiles\.d/inplaced\.conf$'
expect "deb: etc/inplaced/config.toml" "$deb_list" '^-rw-r--r-- (root/root|0/0) .* \./etc/inplaced/config\.toml$'
expect "deb: README" "$deb_list" ' \./usr/share/doc/inplaced/README\.md$'
expect "deb: the NodeSpec JSON Schema" "$deb_list" ' \./usr/share/inplaced/nodespec\.schema\.json$'

conffiles=$(dpkg-deb -I "$deb" conffiles 2>/dev/null || true)
expect "deb: conffiles lists /etc/inplaced/config.toml" "$conffiles" '^/etc/inplaced/config\.toml$'
expect "deb: etc/inplaced/sigstore/fulcio.pem" "$deb_list" '^-rw-r--r-- (root/root|0/0) .* \./etc/inplaced/sigstore/fulcio\.pem$'
expect "deb: conffiles lists the Fulcio trust anchor" "$conffiles" '^/etc/inplaced/sigstore/fulcio\.pem$'
control=$(dpkg-deb -f "$deb")
expect "deb: Section admin" "$control" '^Section: admin$'
expect "deb: Depends on systemd" "$control" '^Depends: .*\bsystemd\b'
expect "deb: Maintainer" "$control" '^Maintainer: inplaced developers <inplaced@example\.invalid>$'

postinst=$(dpkg-deb -I "$deb" postinst 2>/dev/null || true)
prerm=$(dpkg-deb -I "$deb" prerm 2>/dev/null || true)
expect "deb: postinst enables inplaced.service" "$postinst" 'deb-systemd-helper enable inplaced\.service'
expect "deb: postinst applies tmpfiles.d" "$postinst" 'systemd-tmpfiles .*--create .*inplaced\.conf'
refuse "deb: postinst never starts or restarts the agent" "$postinst" 'deb-systemd-invoke .*(start|restart|try-restart)'
expect "deb: prerm stops the agent on remove" "$prerm" 'deb-systemd-invoke stop .*inplaced\.service'
expect "deb: prerm stops only on remove (not on upgrade)" "$prerm" '"\$1" = remove'

dpkg-deb -x "$deb" "$tmp/deb"
if cmp -s systemd/inplaced.service "$tmp/deb/usr/lib/systemd/system/inplaced.service"; then
    ok "deb: unit is systemd/inplaced.service"
else
    fail "deb: unit is systemd/inplaced.service"
fi
if cmp -s packaging/config.toml "$tmp/deb/etc/inplaced/config.toml"; then
    ok "deb: config is packaging/config.toml"
else
    fail "deb: config is packaging/config.toml"
fi
if "$tmp/deb/usr/bin/inplaced" --version >/dev/null && "$tmp/deb/usr/bin/inplacectl" --version >/dev/null; then
    ok "deb: packaged binaries run (--version)"
else
    fail "deb: packaged binaries run (--version)"
fi

for f in usr/share/man/man8/inplaced.8.gz usr/share/man/man1/inplacectl.1.gz \
    usr/share/bash-completion/completions/inplacectl usr/share/bash-completion/completions/inplaced \
    usr/share/zsh/vendor-completions/_inplacectl usr/share/fish/vendor_completions.d/inplacectl.fish; do
    expect "deb: $f" "$deb_list" " \./${f//./\\.}\$"
done
# a page per subcommand, as the main page's SUBCOMMANDS section names them
for sub in status coverage apply watch get history validate reboot; do
    expect "deb: man page inplacectl-$sub(1)" "$deb_list" " \./usr/share/man/man1/inplacectl-$sub\.1\.gz\$"
done
for page in usr/share/man/man8/inplaced.8.gz usr/share/man/man1/inplacectl.1.gz usr/share/man/man1/inplacectl-validate.1.gz; do
    rendered=$(MANWIDTH=80 man -l "$tmp/deb/$page" 2>&1 | col -b 2>/dev/null || true)
    expect "deb: man -l renders $(basename "$page")" "$rendered" '^(SYNOPSIS|NAME)'
done
expect "deb: bash completion knows the subcommands" \
    "$(cat "$tmp/deb/usr/share/bash-completion/completions/inplacectl")" 'coverage'

# --- .rpm
rpm_list=$(rpm -qlp "$rpmf" 2>/dev/null)
for f in /usr/share/man/man8/inplaced.8.gz /usr/share/man/man1/inplacectl.1.gz \
    /usr/share/bash-completion/completions/inplacectl /usr/share/zsh/site-functions/_inplacectl \
    /usr/share/fish/vendor_completions.d/inplacectl.fish; do
    expect "rpm: $f" "$rpm_list" "^${f//./\\.}\$"
done
expect "rpm: man page inplacectl-validate(1)" "$rpm_list" '^/usr/share/man/man1/inplacectl-validate\.1\.gz$'
for f in /usr/bin/inplaced /usr/bin/inplacectl /usr/lib/systemd/system/inplaced.service \
    /usr/lib/tmpfiles.d/inplaced.conf /etc/inplaced/config.toml \
    /etc/inplaced/sigstore/fulcio.pem /usr/share/doc/inplaced/README.md; do
    expect "rpm: $f" "$rpm_list" "^${f//./\\.}\$"
done
# fflags: c = %config, n = noreplace, d = %doc
rpm_files=$(rpm -qp --qf '[%{FILEMODES:perms} %{FILEFLAGS:fflags} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]' "$rpmf" 2>/dev/null)
expect "rpm: config.toml is %config(noreplace)" "$rpm_files" '^-rw-r--r-- [a-z]*c[a-z]*n[a-z]* root:root /etc/inplaced/config\.toml$|^-rw-r--r-- [a-z]*n[a-z]*c[a-z]* root:root /etc/inplaced/config\.toml$'
for f in /usr/bin/inplaced /usr/bin/inplacectl; do
    expect "rpm: $f, mode 0755" "$rpm_files" "^-rwxr-xr-x [a-z]* root:root ${f//./\\.}\$"
done
expect "rpm: unit mode 0644" "$rpm_files" '^-rw-r--r-- [a-z]* root:root /usr/lib/systemd/system/inplaced\.service$'
expect "rpm: README is %doc" "$rpm_files" '^-rw-r--r-- [a-z]*d[a-z]* root:root /usr/share/doc/inplaced/README\.md$'
expect "rpm: requires systemd" "$(rpm -qRp "$rpmf" 2>/dev/null)" '^systemd\b'

scripts=$(rpm -qp --scripts "$rpmf" 2>/dev/null)
# one scriptlet's body, comment lines dropped ("postinstall scriptlet[ (using ...)]:")
scriptlet() { awk -v want="$1" '/^[a-z]+ scriptlet( \(using [^)]*\))?:$/ { p = ($1 == want); next } p && !/^[[:space:]]*#/' <<<"$scripts"; }
post=$(scriptlet postinstall)
preun=$(scriptlet preuninstall)
postun=$(scriptlet postuninstall)
expect "rpm: %post daemon-reload" "$post" 'systemctl daemon-reload'
expect "rpm: %post enables on first install" "$post" 'systemctl .*enable inplaced\.service'
expect "rpm: %post enable is guarded by \$1 -eq 1" "$post" '"\$1" -eq 1'
refuse "rpm: %post never starts or restarts the agent" "$post" 'systemctl .*(start|restart)|--now'
expect "rpm: %preun disable --now on final erase" "$preun" 'systemctl .*disable --now inplaced\.service'
expect "rpm: %preun guarded by \$1 -eq 0" "$preun" '"\$1" -eq 0'
expect "rpm: %postun daemon-reload" "$postun" 'systemctl daemon-reload'
refuse "rpm: %postun never restarts the agent" "$postun" 'systemctl .*(start|restart)'

# Install into an empty root (no scripts, no dependencies): proves rpm accepts the
# package and lays the files out. (rpm2cpio is no use here: cargo-generate-rpm writes no
# archive-size tag, so rpm 4.18's rpm2cpio exits 1 after a complete extraction.)
mkdir -p "$tmp/rpm"
if inst=$(rpm --root "$tmp/rpm" --initdb 2>&1 &&
    rpm --root "$tmp/rpm" -i --nodeps --noscripts "$rpmf" 2>&1 | grep -v -e 'should not be used directly' -e 'assuming you know'); [ -f "$tmp/rpm/usr/bin/inplaced" ]; then
    ok "rpm: installs into an empty root"
else
    fail "rpm: installs into an empty root" "$inst"
fi
if cmp -s systemd/inplaced.service "$tmp/rpm/usr/lib/systemd/system/inplaced.service"; then
    ok "rpm: unit is systemd/inplaced.service"
else
    fail "rpm: unit is systemd/inplaced.service"
fi
# the state directory: cargo-generate-rpm cannot package a directory, so tmpfiles.d
# (applied in %post and at boot) and StateDirectory= create it 0700
expect "rpm: tmpfiles.d makes /var/lib/inplaced 0700 root" \
    "$(cat "$tmp/rpm/usr/lib/tmpfiles.d/inplaced.conf" 2>/dev/null)" '^d /var/lib/inplaced 0700 root root'
expect "rpm: %post applies tmpfiles.d" "$post" 'systemd-tmpfiles --create inplaced\.conf'
if "$tmp/rpm/usr/bin/inplaced" --version >/dev/null; then
    ok "rpm: packaged inplaced runs (--version)"
else
    fail "rpm: packaged inplaced runs (--version)"
fi

# --- the glibc baseline: no packaged binary requires a symbol version above it. The
# dynamic symbol table's version needs (objdump -T: `GLIBC_2.17 memcpy`, ...) are what the
# loader checks at start (`version 'GLIBC_2.34' not found` otherwise).
max_glibc() { objdump -T "$1" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
for bin in "$tmp/deb/usr/bin/inplaced" "$tmp/deb/usr/bin/inplacectl" "$tmp/rpm/usr/bin/inplaced" "$tmp/rpm/usr/bin/inplacectl"; do
    name=${bin#"$tmp/"}
    need=$(max_glibc "$bin")
    if [ -z "$need" ]; then
        fail "glibc: $name has a dynamic symbol table" "objdump -T found no GLIBC_ version"
    elif [ "$(printf '%s\n%s\n' "$need" "$GLIBC_BASELINE" | sort -V | tail -1)" = "$GLIBC_BASELINE" ]; then
        ok "glibc: $name requires at most GLIBC_$need (baseline $GLIBC_BASELINE)"
    else
        fail "glibc: $name requires GLIBC_$need, above the baseline $GLIBC_BASELINE" \
            "$(objdump -T "$bin" | grep -E "GLIBC_$need\b" | head -5)"
    fi
done
say "glibc: the packaged binaries require at most GLIBC_$(max_glibc "$tmp/deb/usr/bin/inplaced")"

# --- the packaged binaries do the main job: the README's demo on the bundled example
# node, with the daemon and CLI from the .deb
if demo=$(INPLACED_BIN_DIR="$tmp/deb/usr/bin" bash examples/demo.sh 2>&1) &&
    grep -q Succeeded <<<"$demo" && grep -q RebootRequired <<<"$demo"; then
    ok "deb binaries: examples/demo.sh (coverage, apply, reboot request) on the example node"
else
    fail "deb binaries: examples/demo.sh on the example node" "$(tail -20 <<<"$demo")"
fi

# --- the unit, as packaged, in a root where /usr/bin/inplaced is the packaged binary.
# verify needs the unit tree it references (sysinit.target, multi-user.target, ...): take
# the host's. Any output (warnings such as an unknown key exit 0) counts as a failure.
root=$tmp/verify-root
mkdir -p "$root/usr/lib/systemd" "$root/usr/bin" "$root/etc"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp "$tmp/deb/usr/lib/systemd/system/inplaced.service" "$root/usr/lib/systemd/system/"
cp "$tmp/deb/usr/bin/inplaced" "$root/usr/bin/"
if verify=$(systemd-analyze verify --man=no --root="$root" \
    "$root/usr/lib/systemd/system/inplaced.service" 2>&1) && [ -z "$verify" ]; then
    ok "unit: systemd-analyze verify"
else
    fail "unit: systemd-analyze verify" "$verify"
fi
unit=$(cat systemd/inplaced.service)
expect "unit: Type=notify" "$unit" '^Type=notify$'
expect "unit: StateDirectory=inplaced" "$unit" '^StateDirectory=inplaced$'
expect "unit: StateDirectoryMode=0700" "$unit" '^StateDirectoryMode=0700$'
expect "unit: RuntimeDirectory=inplaced" "$unit" '^RuntimeDirectory=inplaced$'
expect "unit: NoNewPrivileges" "$unit" '^NoNewPrivileges=yes$'
expect "unit: PrivateTmp" "$unit" '^PrivateTmp=yes$'
expect "unit: CapabilityBoundingSet" "$unit" '^CapabilityBoundingSet=CAP_'
refuse "unit: /proc/sys stays writable (no ProtectKernelTunables)" "$unit" '^ProtectKernelTunables=(yes|true|on|1)'
refuse "unit: managed paths stay writable (no ProtectSystem, ReadOnlyPaths)" "$unit" '^(ProtectSystem=(yes|true|on|1|full|strict)|ReadOnlyPaths=)'
refuse "unit: block devices reachable for grub-probe (no ProtectClock, PrivateDevices, DeviceAllow)" "$unit" '^(ProtectClock=(yes|true|on|1)|PrivateDevices=(yes|true|on|1)|DeviceAllow=|DevicePolicy=(closed|strict))'

echo "packaging: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
