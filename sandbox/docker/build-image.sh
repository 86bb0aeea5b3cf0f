#!/bin/sh
# Build the docker sandbox image without pulling anything from a registry:
#   build-image.sh TAG SUITE MIRROR
# debootstrap --variant=minbase of SUITE from MIRROR (a Debian archive, as apt uses) plus the
# packages in packages.txt, trimmed (no apt lists, docs, man pages, locales), /root made
# traversable (the host interpreter may be mounted under /root/.pyenv), then `docker import`ed as
# TAG. The tag carries a hash of this script and packages.txt (sandbox/docker/image.py), so an
# edited recipe builds a new image and an unchanged one is never rebuilt.
set -eu
tag=$1 suite=$2 mirror=$3
here=$(cd "$(dirname "$0")" && pwd)
packages=$(grep -v '^#' "$here/packages.txt" | grep -v '^$' | paste -sd, -)
work=$(mktemp -d "${TMPDIR:-/var/tmp}/envsched-rootfs.XXXXXX")
root="$work/root"
# debootstrap mounts /proc and /sys in the rootfs, and in a container may bind the host's /dev
# there; an interrupted run leaves them mounted, so unmount before deleting and never cross one
cleanup() {
  awk -v r="$root" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/locale \
  "$root"/var/log/*
chmod 0755 "$root/root"
tar -C "$root" --numeric-owner --one-file-system -c . | docker import \
  --change 'USER 65534:65534' --change 'WORKDIR /tmp' --change 'ENV LANG=C.UTF-8' \
  --message "envsched sandbox rootfs: debootstrap $suite minbase + $packages" - "$tag" >/dev/null
