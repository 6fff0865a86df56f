#!/usr/bin/env bash
# Prepares everything the QEMU NUMA guest needs, from Debian packages only, and caches
# it under <repo>/target/qemu so that a second run returns at once:
#   - qemu-system-x86, busybox-static and numactl installed with apt when missing;
#   - the newest linux-image-6.1.0-N-amd64 (or bookworm-backports', PINION_QEMU_KERNEL
#     below) fetched with `apt-get download` and unpacked with `dpkg -x` (never installed);
#   - an initramfs (busybox-static + the kernel modules for virtio-pci, 9p and overlayfs,
#     in modules.dep order + e2e/qemu/init.sh as /init);
#   - numa-touch, a tiny allocator built with the host's C compiler.
# On success it prints shell assignments (QEMU_KERNEL=..., QEMU_INITRD=..., NUMA_TOUCH=...)
# on stdout; everything else goes to stderr. Usage: e2e/qemu/prepare.sh [CACHE_DIR]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${1:-$repo/target/qemu}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
log() { echo "prepare: $*" >&2; }

# apt is shared with other jobs on the machine: wait for its lock rather than fail.
apt_opts=(-o DPkg::Lock::Timeout=300 -q)

# --- host packages -------------------------------------------------------------------
need=()
for pkg in qemu-system-x86 busybox-static numactl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    log "missing packages ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
    exit 3 # the test skips on exit 3 outside CI
  fi
  log "installing ${need[*]}"
  apt-get "${apt_opts[@]}" update >&2
  DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "${need[@]}" >&2
fi

# --- kernel --------------------------------------------------------------------------
# PINION_QEMU_KERNEL picks the guest's kernel: `bookworm` (the default) is the newest
# 6.1.0-N-amd64 image the apt lists know (not -cloud-, not -rt-), Debian 12's own;
# `backports` is the newest bookworm-backports PREEMPT_RT image (6.12 now), for what
# needs Linux 6.7 or later (cgroup v2's cpuset.cpus.exclusive) and a real-time kernel
# as telecom nodes run one, read through apt lists of this cache's own so that the
# host's apt configuration is never touched. When the cache already holds one, it is
# used without asking apt: a second run must start at once.
kernel=${PINION_QEMU_KERNEL:-bookworm}
case $kernel in
  bookworm)
    glob='linux-image-6.1.0-*-amd64' want='^linux-image-6\.1\.0-[0-9]+-amd64$'
    kapt=("${apt_opts[@]}") ;;
  backports)
    glob='linux-image-[0-9]*+deb12-rt-amd64' want='^linux-image-[0-9]+\.[0-9]+\.[0-9]+\+deb12-rt-amd64$'
    aptdir=$cache/apt-backports
    mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' >"$aptdir/sources.list"
    kapt=("${apt_opts[@]}" -o "Dir::Etc::SourceList=$aptdir/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$aptdir/lists" -o "Dir::Cache=$aptdir/cache") ;;
  *)
    log "PINION_QEMU_KERNEL=$kernel: expected bookworm or backports"
    exit 1 ;;
esac
# PINION_QEMU_KERNEL_DIR names another unpacked linux-image package instead (a folder
# with boot/vmlinuz-VERSION and lib/modules/VERSION, named linux-image-VERSION), to try
# a kernel by hand; CI never sets it.
if [ -n "${PINION_QEMU_KERNEL_DIR:-}" ]; then
  kdir=$PINION_QEMU_KERNEL_DIR
else
  kdir=$(find "$cache" -maxdepth 1 -type d -name "$glob" | sort -V | tail -n 1)
  if [ -z "$kdir" ] || [ ! -e "$kdir/.unpacked" ]; then
    newest() { apt-cache "${kapt[@]}" pkgnames linux-image-6 | grep -E "$want" | sort -V | tail -n 1 || true; }
    pkg=$(newest)
    if [ -z "$pkg" ]; then
      apt-get "${kapt[@]}" update >&2
      pkg=$(newest)
    fi
    [ -n "$pkg" ] || { log "no $kernel linux-image package known to apt"; exit 1; }
    kdir=$cache/$pkg
    log "downloading and unpacking $pkg"
    rm -rf "$kdir" "$cache/download"
    mkdir -p "$cache/download" "$kdir"
    # apt-get download writes into the current directory; _apt needs to be able to write it.
    (cd "$cache/download" && chmod 777 . && apt-get "${kapt[@]}" download "$pkg" >&2)
    dpkg -x "$cache"/download/"$pkg"_*.deb "$kdir"
    rm -rf "$cache/download"
    touch "$kdir/.unpacked"
  fi
fi
kver=${kdir##*/linux-image-}
vmlinuz=$kdir/boot/vmlinuz-$kver
moddir=$kdir/lib/modules/$kver
[ -f "$vmlinuz" ] || { log "kernel image $vmlinuz missing"; exit 1; }

# --- initramfs -----------------------------------------------------------------------
# Rebuilt when init.sh or this script changes (their hash names the file).
stamp=$(cat "$here/init.sh" "$here/prepare.sh" | sha256sum | cut -c1-16)
initrd=$cache/initrd-$kver-$stamp.cpio.gz
if [ ! -f "$initrd" ]; then
  log "building $initrd"
  work=$(mktemp -d "$cache/initrd.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work"/{bin,dev,proc,sys,newroot,hostroot,lib/modules}
  cp /bin/busybox "$work/bin/busybox"
  ln -s busybox "$work/bin/sh"
  # Modules the guest needs, each after those its .modinfo `depends=` names (the Debian
  # package ships no modules.dep and kmod may be absent, so read the modules themselves).
  # A name with no .ko file is built in (modules.builtin) and skipped.
  declare -A kofile=() seen=()
  while IFS= read -r f; do
    n=${f##*/}; n=${n%%.ko*}; kofile[${n//-/_}]=$f
  done < <(find "$moddir/kernel" -name '*.ko*')
  order=()
  resolve() {
    local name=$1 f dep deps
    [ -n "${seen[$name]:-}" ] && return 0
    seen[$name]=1
    f=${kofile[$name]:-}
    if [ -z "$f" ]; then
      grep -qE "/${name//_/[-_]}\.ko\$" "$moddir/modules.builtin" || log "module $name neither built in nor shipped"
      return 0
    fi
    case "$f" in
      *.xz) deps=$(xz -dc "$f" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -n 1) ;;
      *.zst) deps=$(zstd -qdc "$f" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -n 1) ;;
      *) deps=$(tr '\0' '\n' <"$f" | sed -n 's/^depends=//p' | head -n 1) ;;
    esac
    for dep in ${deps//,/ }; do
      resolve "$dep"
    done
    order+=("${f#"$moddir/"}")
  }
  for name in virtio_pci 9pnet_virtio 9p overlay; do
    resolve "$name"
  done
  : >"$work/lib/modules/order"
  for rel in "${order[@]}"; do
    base=${rel##*/}
    case "$base" in
      *.ko.xz) xz -dc "$moddir/$rel" >"$work/lib/modules/${base%.xz}"; base=${base%.xz} ;;
      *.ko.zst) zstd -qdc "$moddir/$rel" >"$work/lib/modules/${base%.zst}"; base=${base%.zst} ;;
      *) cp "$moddir/$rel" "$work/lib/modules/$base" ;;
    esac
    echo "$base" >>"$work/lib/modules/order"
  done
  log "modules: $(tr '\n' ' ' <"$work/lib/modules/order")"
  cp "$here/init.sh" "$work/init"
  chmod 755 "$work/init"
  # busybox's own cpio: one package fewer on the host (names here have no newlines).
  (cd "$work" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$work"
  trap - EXIT
  # This kernel's older initramfs files are stale now (not the other kernel's: its
  # guest may be booting from one).
  find "$cache" -maxdepth 1 -name "initrd-$kver-*.cpio.gz" ! -path "$initrd" -delete
fi

# --- numa-touch ----------------------------------------------------------------------
touch_bin=$cache/numa-touch
if [ ! -x "$touch_bin" ] || [ "$here/numa-touch.c" -nt "$touch_bin" ]; then
  log "building $touch_bin"
  cc -O2 -Wall -o "$touch_bin.tmp" "$here/numa-touch.c"
  mv "$touch_bin.tmp" "$touch_bin"
fi

echo "QEMU_KERNEL=$vmlinuz"
echo "QEMU_INITRD=$initrd"
echo "QEMU_KERNEL_VERSION=$kver"
echo "NUMA_TOUCH=$touch_bin"
