#!/usr/bin/env bash
# Builds (or reuses) the cached base image of the VM test: Debian bookworm, minbase, with
# systemd, a kernel, a serial console, a static address for QEMU's user network and a 9p
# share, and one of two boot paths:
#   bios: GRUB on BIOS, one MBR partition (update-grub, /etc/default/grub)
#   uefi: systemd-boot on UEFI (OVMF), GPT with an ESP at /boot/efi, Type #1 (BLS)
#         entries written by kernel-install from /etc/kernel/cmdline
# Nothing of inplaced is in it: run.sh installs the package into a per-run copy.
#
#   bash tests/vm/image.sh [bios|uefi]      # prints the path of the cached qcow2
#
# The cache key is a hash of this file and the package list, so editing the recipe
# rebuilds. Cache: $INPLACED_VM_CACHE (default /var/cache/inplaced-vm). Built on tmpfs.
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
here=$(cd "$(dirname "$0")" && pwd)

SUITE=bookworm
BOOT=${1:-bios}
PACKAGES=systemd,systemd-sysv,udev,dbus,linux-image-amd64,initramfs-tools,e2fsprogs,kmod,iproute2,procps,kexec-tools
case "$BOOT" in
bios) PACKAGES=$PACKAGES,grub-pc ;;
uefi) PACKAGES=$PACKAGES,systemd-boot ;;
*) echo "usage: image.sh [bios|uefi]" >&2; exit 2 ;;
esac
DISK_SIZE=2G
cache=${INPLACED_VM_CACHE:-/var/cache/inplaced-vm}
key=$( { cat "$here/image.sh"; echo "$SUITE $BOOT $PACKAGES $DISK_SIZE"; } | sha256sum | cut -c1-16)
image=$cache/base-$SUITE-$BOOT-$key.qcow2

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
    for m in boot/efi dev/pts dev proc sys; do mountpoint -q "$mnt/$m" && umount -l "$mnt/$m"; done
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

# disk: bios: one bootable MBR partition from 1 MiB; uefi: GPT, a 200 MiB ESP, then root
truncate -s "$DISK_SIZE" "$work/disk.raw"
if [ "$BOOT" = bios ]; then
    printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$work/disk.raw"
else
    printf 'label: gpt\nstart=2048, size=200MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\ntype=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n' |
        sfdisk -q "$work/disk.raw"
fi
loop=$(losetup -f --show "$work/disk.raw")
# losetup -P makes no partition devices on some host kernels; partx -a does
partx -a "$loop" 2>/dev/null || true
partdev() { # N: the partition device, made from sysfs when there is no devtmpfs node
    local p=${loop}p$1 dev
    for _ in $(seq 50); do [ -b "$p" ] && break; sleep 0.1; done
    if [ ! -b "$p" ]; then
        dev=$(cat "/sys/block/${loop#/dev/}/${p#/dev/}/dev")
        mknod "$p" b "${dev%:*}" "${dev#*:}"
    fi
    echo "$p"
}
if [ "$BOOT" = bios ]; then
    part=$(partdev 1)
else
    esp=$(partdev 1)
    part=$(partdev 2)
    mkfs.vfat -F 32 -n ESP "$esp" >/dev/null
    esp_uuid=$(blkid -s UUID -o value "$esp")
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
cp -a "$loop" "$part" ${esp:+"$esp"} "$mnt/dev/"
mkdir -p "$mnt/dev/disk/by-uuid" "$mnt/dev/pts"
ln -s "../../${part#/dev/}" "$mnt/dev/disk/by-uuid/$uuid"
if [ "$BOOT" = uefi ]; then
    # the host kernel may have no vfat: the ESP's tree is made in /boot/efi on the root
    # and copied into the FAT file system with mtools afterwards
    ln -s "../../${esp#/dev/}" "$mnt/dev/disk/by-uuid/$esp_uuid"
    mkdir -p "$mnt/boot/efi"
    mount -t tmpfs -o mode=0700 esp "$mnt/boot/efi"
fi
mount -t proc proc "$mnt/proc"
mount -t sysfs sys "$mnt/sys"
mount -t devpts devpts "$mnt/dev/pts"

# guest configuration
cat >"$mnt/etc/fstab" <<EOF
UUID=$uuid / ext4 errors=remount-ro 0 1
${esp_uuid:+UUID=$esp_uuid /boot/efi vfat umask=0077 0 1
}vmshare /mnt/vm 9p trans=virtio,version=9p2000.L,msize=262144,nofail,x-systemd.device-timeout=30s 0 0
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
# kexec-tools is there for `systemctl kexec` (the kexec scenario); its own kexec on every
# reboot stays off, so a full reboot is a full reboot
[ ! -f /etc/default/kexec ] || sed -i 's/^LOAD_KEXEC=.*/LOAD_KEXEC=false/' /etc/default/kexec
# (on uefi the systemd-boot hook fails here: the boot loader is installed below)
update-initramfs -u -k all >/dev/null 2>&1 || true
EOF
initrd_list=$(chroot "$mnt" sh -c 'lsinitramfs /boot/initrd.img-*')
grep -q 'virtio_blk' <<<"$initrd_list" || { say "initrd lacks virtio_blk"; exit 1; }
say "configured: $((SECONDS - t0)) s"
if [ "$BOOT" = bios ]; then
    chroot "$mnt" grub-install --target=i386-pc --modules="part_msdos ext2" "$loop" >/dev/null 2>&1 ||
        chroot "$mnt" grub-install --target=i386-pc --modules="part_msdos ext2" "$loop"
    chroot "$mnt" update-grub >/dev/null 2>&1 || chroot "$mnt" update-grub
    grep -q "root=UUID=$uuid" "$mnt/boot/grub/grub.cfg" || { say "grub.cfg has no root=UUID=$uuid"; exit 1; }
else
    rm -f "$mnt/etc/default/grub"
    # the command line kernel-install writes into the entries' options
    mkdir -p "$mnt/etc/kernel"
    echo "root=UUID=$uuid ro console=ttyS0,115200n8" >"$mnt/etc/kernel/cmdline"
    chroot "$mnt" env SYSTEMD_RELAX_ESP_CHECKS=1 bootctl install --esp-path=/boot/efi --no-variables >"$work/bootctl.log" 2>&1 ||
        { cat "$work/bootctl.log" >&2; exit 1; }
    printf 'timeout 0\nconsole-mode keep\n' >"$mnt/boot/efi/loader/loader.conf"
    kver=$(basename "$(ls -d "$mnt"/lib/modules/*)")
    chroot "$mnt" env SYSTEMD_RELAX_ESP_CHECKS=1 kernel-install add "$kver" "/boot/vmlinuz-$kver" "/boot/initrd.img-$kver" >"$work/kernel-install.log" 2>&1 ||
        { cat "$work/kernel-install.log" >&2; exit 1; }
    entries=$(ls "$mnt"/boot/efi/loader/entries/*.conf 2>/dev/null)
    [ -n "$entries" ] || { say "kernel-install wrote no BLS entry"; cat "$work/kernel-install.log" >&2; exit 1; }
    grep -q "root=UUID=$uuid" $entries || { say "BLS entry has no root=UUID=$uuid"; cat $entries >&2; exit 1; }
    (cd "$mnt/boot/efi" && MTOOLS_SKIP_CHECK=1 mcopy -s -Q -i "$work/disk.raw@@1M" ./* ::/)
    umount "$mnt/boot/efi"
fi
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
