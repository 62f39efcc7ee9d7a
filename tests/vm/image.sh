#!/usr/bin/env bash
# Builds (or reuses) the cached base image of the VM test: Debian bookworm, minbase, with
# systemd, a kernel, GRUB on BIOS (one MBR partition), a serial console, a static address
# for QEMU's user network and a 9p share. Nothing of inplaced is in it: run.sh installs the
# package into a per-run copy.
#
#   bash tests/vm/image.sh          # prints the path of the cached qcow2
#
# The cache key is a hash of this file and the package list, so editing the recipe
# rebuilds. Cache: $INPLACED_VM_CACHE (default /var/cache/inplaced-vm). Built on tmpfs.
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
here=$(cd "$(dirname "$0")" && pwd)

SUITE=bookworm
PACKAGES=systemd,systemd-sysv,udev,dbus,linux-image-amd64,grub-pc,initramfs-tools,e2fsprogs,kmod,iproute2,procps
DISK_SIZE=2G
cache=${INPLACED_VM_CACHE:-/var/cache/inplaced-vm}
key=$( { cat "$here/image.sh"; echo "$SUITE $PACKAGES $DISK_SIZE"; } | sha256sum | cut -c1-16)
image=$cache/base-$SUITE-$key.qcow2

say() { printf 'vm-image: %s\n' "$*" >&2; }

if [ -f "$image" ]; then
    say "cached $image"
    echo "$image"
    exit 0
fi
mkdir -p "$cache"

work=$(mktemp -d /dev/shm/inplaced-vm-image.XXXXXX)
loop=
mnt=$work/mnt
cleanup() {
    set +e
    for m in dev/pts dev proc sys; do mountpoint -q "$mnt/$m" && umount -l "$mnt/$m"; done
    mountpoint -q "$mnt" && umount "$mnt"
    if [ -n "$loop" ]; then
        partx -d "$loop" 2>/dev/null
        losetup -d "$loop"
    fi
    rm -rf "$work"
}
trap cleanup EXIT

t0=$SECONDS
# The host's own apt sources on standard input: no mirror is written in the repository.
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
say "mmdebstrap $SUITE ($PACKAGES)"
mmdebstrap --variant=minbase --include="$PACKAGES" --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt=force-unsafe-io \
    --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" && echo MODULES=list > "$1/etc/initramfs-tools/conf.d/vm-modules"' \
    --quiet "$SUITE" "$work/root" - <"$sources"
say "rootfs: $((SECONDS - t0)) s"

# disk: one bootable MBR partition from 1 MiB
truncate -s "$DISK_SIZE" "$work/disk.raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$work/disk.raw"
loop=$(losetup -f --show "$work/disk.raw")
# losetup -P makes no partition devices on some host kernels; partx -a does
partx -a "$loop" 2>/dev/null || true
part=${loop}p1
for _ in $(seq 50); do [ -b "$part" ] && break; sleep 0.1; done
if [ ! -b "$part" ]; then
    # no devtmpfs node: make it from sysfs
    dev=$(cat "/sys/block/${loop#/dev/}/${part#/dev/}/dev")
    mknod "$part" b "${dev%:*}" "${dev#*:}"
fi
mkfs.ext4 -q -L vmroot "$part"
uuid=$(blkid -s UUID -o value "$part")
mkdir -p "$mnt"
mount "$part" "$mnt"
cp -a "$work/root/." "$mnt/"
rm -rf "$work/root"

# A private /dev for the chroot: the disk, its partition and /dev/disk/by-uuid/<uuid>
# (update-grub writes root=UUID= only when that link exists; the host has no udev).
mount -t tmpfs -o mode=0755 vmdev "$mnt/dev"
for n in null zero full random urandom tty; do cp -a "/dev/$n" "$mnt/dev/"; done
cp -a "$loop" "$part" "$mnt/dev/"
mkdir -p "$mnt/dev/disk/by-uuid" "$mnt/dev/pts"
ln -s "../../${part#/dev/}" "$mnt/dev/disk/by-uuid/$uuid"
mount -t proc proc "$mnt/proc"
mount -t sysfs sys "$mnt/sys"
mount -t devpts devpts "$mnt/dev/pts"

# guest configuration
cat >"$mnt/etc/fstab" <<EOF
UUID=$uuid / ext4 errors=remount-ro 0 1
vmshare /mnt/vm 9p trans=virtio,version=9p2000.L,msize=262144,nofail,x-systemd.device-timeout=30s 0 0
EOF
mkdir -p "$mnt/mnt/vm"
echo edge-vm >"$mnt/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 edge-vm\n' >"$mnt/etc/hosts"
printf '9p\n9pnet\n9pnet_virtio\n' >"$mnt/etc/modules-load.d/vm-9p.conf"
printf 'virtio_pci\nvirtio_blk\nvirtio_scsi\nvirtio_console\next4\n' >>"$mnt/etc/initramfs-tools/modules"
mkdir -p "$mnt/etc/systemd/network"
cat >"$mnt/etc/systemd/network/10-vm.network" <<'EOF'
[Match]
Name=en* eth*
[Network]
Address=10.0.2.15/24
Gateway=10.0.2.2
EOF
cat >"$mnt/etc/default/grub" <<'EOF'
# Debian's defaults, with a serial console and no menu delay (VM test image)
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0,115200n8"
GRUB_CMDLINE_LINUX=""
GRUB_TERMINAL=serial
GRUB_SERIAL_COMMAND="serial --speed=115200 --unit=0 --word=8 --parity=no --stop=1"
GRUB_DISABLE_OS_PROBER=true
EOF
chroot "$mnt" /bin/sh -eu <<'EOF'
export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin
passwd -d root >/dev/null
rm -f /etc/machine-id && systemd-machine-id-setup >/dev/null 2>&1
systemctl enable systemd-networkd.service >/dev/null 2>&1
for t in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
    systemctl mask "$t" >/dev/null 2>&1 || true
done
# a root shell on the serial console (debugging a failed run by hand)
mkdir -p /etc/systemd/system/serial-getty@ttyS0.service.d
printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %%I $TERM\n' \
    > /etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf
update-initramfs -u -k all >/dev/null 2>&1
EOF
say "configured: $((SECONDS - t0)) s"
chroot "$mnt" grub-install --target=i386-pc --modules="part_msdos ext2" "$loop" >/dev/null 2>&1 ||
    chroot "$mnt" grub-install --target=i386-pc --modules="part_msdos ext2" "$loop"
chroot "$mnt" update-grub >/dev/null 2>&1 || chroot "$mnt" update-grub
grep -q "root=UUID=$uuid" "$mnt/boot/grub/grub.cfg" || { say "grub.cfg has no root=UUID=$uuid"; exit 1; }
say "boot loader: $((SECONDS - t0)) s"

sync
for m in dev/pts dev proc sys; do umount "$mnt/$m"; done
umount "$mnt"
partx -d "$loop" 2>/dev/null || true
losetup -d "$loop"
loop=
qemu-img convert -c -O qcow2 "$work/disk.raw" "$image.tmp"
mv "$image.tmp" "$image"
say "built $image ($(du -h "$image" | cut -f1)) in $((SECONDS - t0)) s"
echo "$image"
