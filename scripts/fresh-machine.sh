#!/usr/bin/env bash
# Proves the README's commands on a fresh machine: builds a minimal Debian 12 root, or with
# FRESH_DIST=noble an Ubuntu 24.04 one (the GPU machines' system)
# (debootstrap --variant=minbase: apt, dpkg, bash and coreutils, nothing else), copies this
# checkout into it, and runs the given commands there (default: both README commands,
# `scripts/main.sh` then `scripts/test.sh`). Everything they need must come from the
# project's own set-up (scripts/setup.sh); the only thing shared with this machine is the Rust
# toolchain (no toolchain can be fetched here), bind-mounted read-only, and the machine's local
# CA certificates (for a TLS-intercepting egress). At the end it prints
# the packages the set-up installed on top of the minimal root.
#
#   scripts/fresh-machine.sh                      # both README commands, Debian 12
#   scripts/fresh-machine.sh 'bash scripts/main.sh -- --requests 2'
#   FRESH_DIST=noble scripts/fresh-machine.sh     # both README commands, Ubuntu 24.04
#
# Needs root (chroot, mounts) and debootstrap (installed when missing). FRESH_DIST picks the
# release (default bookworm; Ubuntu: noble, jammy), FRESH_MIRROR its archive, FRESH_ROOT the
# directory (default /tmp/nixl-fresh-<pid>); it is removed at the end unless FRESH_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)

if [ "$(id -u)" -ne 0 ]; then
    echo "fresh-machine.sh: needs root (chroot and mounts)" >&2
    exit 2
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
cmds=("$@")
if [ ${#cmds[@]} -eq 0 ]; then
    cmds=("bash scripts/main.sh" "bash scripts/test.sh")
fi

root="${FRESH_ROOT:-/tmp/nixl-fresh-$$}"
kdir=""
dist="${FRESH_DIST:-bookworm}"
case "$dist" in
noble | jammy) os=Ubuntu ;;
*) os=Debian ;;
esac
if [ "$os" = Debian ]; then
    mirror="${FRESH_MIRROR:-http://deb.debian.org/debian}"
    bootstrap=(debootstrap --variant=minbase "$dist" "$root" "$mirror")
else
    mirror="${FRESH_MIRROR:-http://archive.ubuntu.com/ubuntu}"
    # Ubuntu's archive key, which Debian 12 does not package: taken from the archive's own
    # ubuntu-keyring package and trusted only for the key whose fingerprint is pinned here
    # (Ubuntu Archive Automatic Signing Key (2018) <ftpmaster@ubuntu.com>, the key that signs
    # jammy and noble), so debootstrap still checks every index it fetches.
    ubuntu_key=F6ECB3762474EDA9D21B7022871920D1991BC93C
    command -v gpg >/dev/null 2>&1 || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gpg >/dev/null
    }
    kdir=$(mktemp -d)
    keyring="$kdir/ubuntu-archive.gpg"
    curl -fsS -o "$kdir/k.deb" \
        "$mirror/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
    dpkg-deb -x "$kdir/k.deb" "$kdir/x"
    gpg --homedir "$kdir" --quiet --no-default-keyring \
        --keyring "$kdir/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" \
        --export "$ubuntu_key" >"$keyring"
    if ! gpg --show-keys --with-colons "$keyring" 2>/dev/null | grep -q "^fpr:*$ubuntu_key:"; then
        echo "fresh-machine.sh: Ubuntu's archive key $ubuntu_key is not in ubuntu-keyring" >&2
        exit 1
    fi
    # Debian 12's debootstrap has no script for releases newer than it; every Ubuntu one is
    # gutsy's. Components: etcd-server, libfabric, pip and ROCm's HIP are in universe.
    script=/usr/share/debootstrap/scripts/$dist
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/gutsy
    bootstrap=(debootstrap --variant=minbase --components=main,universe --keyring="$keyring"
        "$dist" "$root" "$mirror" "$script")
fi
mounts=()
cleanup() {
    local m
    # Mounts the commands made inside the root (`ip netns add` makes /run/netns one), then
    # ours, innermost first.
    local inner
    inner=$(awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r)
    for m in $inner; do
        umount -l "$m" 2>/dev/null || true
    done
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m="${mounts[$i]}"
        umount -l "$m" 2>/dev/null || true
    done
    # Processes the commands left behind (servers of a failed test) hold the mounts.
    if [ -d "$root/proc" ]; then
        for p in /proc/[0-9]*; do
            if [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ]; then
                kill -9 "${p#/proc/}" 2>/dev/null || true
            fi
        done
    fi
    if [ -n "$kdir" ]; then rm -rf "$kdir"; fi
    if [ "${FRESH_KEEP:-0}" != 1 ]; then
        rm -rf --one-file-system "$root"
    fi
}
trap cleanup EXIT

t0=$(date +%s)
echo "== fresh-machine: debootstrap --variant=minbase $dist $root"
"${bootstrap[@]}" >"$root.debootstrap.log" 2>&1 || {
    tail -20 "$root.debootstrap.log"
    exit 1
}
rm -f "$root.debootstrap.log"
if [ "$os" = Ubuntu ]; then
    rm -rf "$kdir"
    # An installed Ubuntu takes its packages from the release and its updates and security
    # pockets; debootstrap names only the release.
    for pocket in updates security; do
        echo "deb $mirror $dist-$pocket main universe" >>"$root/etc/apt/sources.list"
    done
fi
dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package}\n' | sort >"$root/.base-packages"

mnt() { mount "$@"; mounts+=("${!#}"); }
# A machine's root is a mount point, and tools that give a process mount namespaces of its
# own (`ip netns exec`, `unshare --mount`: the network-namespace tests) make it private or a
# slave, which fails on a chroot whose root is a plain directory: bind it onto itself first.
mnt --bind "$root" "$root"
mount --make-private "$root"
mnt -t proc proc "$root/proc"
mnt -t sysfs sys "$root/sys"
mnt --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
mnt -t tmpfs tmpfs "$root/tmp"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's own CA certificates (a TLS-intercepting egress, where there is one): a fresh
# machine of the same network has them; the ca-certificates package adds them to the bundle.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi

# The Rust toolchain, read-only (rustup's home and its proxies).
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_bin="$(dirname "$(command -v cargo)")"
mkdir -p "$root/opt/rust/rustup" "$root/opt/rust/bin"
mnt --bind "$rustup_home" "$root/opt/rust/rustup"
mount -o remount,bind,ro "$root/opt/rust/rustup"
mnt --bind "$cargo_bin" "$root/opt/rust/bin"
mount -o remount,bind,ro "$root/opt/rust/bin"

# The checkout: tracked files and untracked ones git does not ignore (what CI's clone has).
mkdir -p "$root/work/nixl-rs"
git ls-files -z --cached --others --exclude-standard |
    (cd "$src" && xargs -0 tar --no-recursion -cf - 2>/dev/null) |
    tar -xf - -C "$root/work/nixl-rs"
if [ -d ../shared ]; then
    cp -r ../shared "$root/work/shared"
fi
echo "== fresh-machine: root ready in $(($(date +%s) - t0)) s"

status=0
for c in "${cmds[@]}"; do
    echo "== fresh-machine: $c"
    t=$(date +%s)
    if chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
        PATH=/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        RUSTUP_HOME=/opt/rust/rustup CARGO_HOME=/root/.cargo CARGO_INCREMENTAL=0 \
        NIXL_REQUIRE_DEPS="${NIXL_REQUIRE_DEPS:-1}" \
        /bin/bash -c "cd /work/nixl-rs && $c"; then
        echo "== fresh-machine: '$c' passed in $(($(date +%s) - t)) s"
        # The packages' downloaded archives (about 0.3 GiB) are of no use once installed; CI's
        # disk (about 8 GiB for the root) holds the next command's build with them gone.
        chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get clean >/dev/null 2>&1 || true
    else
        status=$?
        echo "== fresh-machine: '$c' FAILED (exit $status) after $(($(date +%s) - t)) s"
        break
    fi
done

echo "== fresh-machine: $os packages the set-up installed on top of minbase:"
dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package}\n' | sort |
    comm -13 "$root/.base-packages" - | tr '\n' ' '
echo
echo "== fresh-machine: total $(($(date +%s) - t0)) s, exit $status"
exit $status
