#!/usr/bin/env bash
# Install s4fs as a service on this machine (run as root, after s4fs itself is
# installed, e.g. `pip install 's4fs[service,s3,fuse]'` into /opt/s4fs):
#
#   deploy/install.sh [--store URL] [--mountpoint DIR] [--product-code CODE]
#                     [--public-key-version N] [--s4fs-bin PATH] [--mount-unit]
#                     [--passthrough] [--force-config] [--start] [--root DIR]
#
# --s4fs-bin defaults to /opt/s4fs/bin/s4fs (the image's venv), else `command -v s4fs`.
#
# * creates the system user and group s4fs (no shell, no home);
# * writes /etc/s4fs/config.toml from deploy/config.example.toml (root:s4fs 0640),
#   unless it exists (--force-config replaces it);
# * sets user_allow_other in /etc/fuse.conf, so the mount can serve the training job;
# * creates the mountpoint (s4fs 0755), /var/cache/s4fs and /var/lib/s4fs (s4fs 0750);
# * links /usr/local/bin/s4fs and /sbin/mount.fuse.s4fs to the installed commands;
# * installs s4fs-runner.service (and, with --mount-unit, the mount unit for the
#   mountpoint, with the runner set to manage_mount = false), reloads systemd and
#   enables the runner; --start also starts it;
# * with --passthrough, the drop-in s4fs-runner.service.d/passthrough.conf: the runner
#   and its mount daemon get CAP_SYS_ADMIN, which the kernel asks of a FUSE mount that
#   registers backing files (FUSE passthrough: kernel >= 6.9, pyfuse3 built by
#   `s4fs build-passthrough`). Without it the runner's mount goes through FUSE requests.
#
# --root DIR installs into DIR instead of / (for images and tests): nothing is started,
# the user is added to DIR/etc/passwd and --s4fs-bin is a path inside DIR. Running it
# again is safe.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

root=""
store="/var/lib/s4fs/store"
mountpoint="/mnt/s4"
product_code=""
public_key_version="1"
s4fs_bin=""
mount_unit=0
passthrough=0
force_config=0
start=0

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }
sed_escape() { printf '%s' "$1" | sed -e 's/[&|\\]/\\&/g'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        --store) store="${2:?--store needs a URL}"; shift 2 ;;
        --mountpoint) mountpoint="${2:?--mountpoint needs a directory}"; shift 2 ;;
        --product-code) product_code="${2:?--product-code needs a value}"; shift 2 ;;
        --public-key-version) public_key_version="${2:?}"; shift 2 ;;
        --s4fs-bin) s4fs_bin="${2:?--s4fs-bin needs a path}"; shift 2 ;;
        --mount-unit) mount_unit=1; shift ;;
        --passthrough) passthrough=1; shift ;;
        --force-config) force_config=1; shift ;;
        --start) start=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

[ "$(id -u)" = 0 ] || die "run me as root (I create a user and write to /etc)"
[ -z "$root" ] || root="$(cd "$root" && pwd)"
case "$mountpoint" in
    /*) ;;
    *) die "--mountpoint must be an absolute path, got $mountpoint" ;;
esac
[ "$mountpoint" != "/" ] || die "--mountpoint must not be /"
case "$public_key_version" in
    ''|*[!0-9]*) die "--public-key-version must be a positive integer" ;;
esac
# values end up inside TOML strings: keep them to characters that need no quoting
for v in "$store" "$mountpoint" "$product_code"; do
    case "$v" in
        *[\"\\\ ]*|*[[:cntrl:]]*) die "unsupported character in $v (no quotes, backslashes or spaces)" ;;
    esac
done

# --- the user -------------------------------------------------------------------------
passwd_file="$root/etc/passwd"
if ! grep -q '^s4fs:' "$passwd_file" 2>/dev/null; then
    prefix_opt=()
    [ -z "$root" ] || prefix_opt=(--prefix "$root")
    nologin=/usr/sbin/nologin
    [ -x "$nologin" ] || nologin=/sbin/nologin
    useradd "${prefix_opt[@]}" --system --user-group --no-create-home \
        --home-dir /var/lib/s4fs --shell "$nologin" --comment "s4fs checkpoint filesystem" s4fs
    say "created system user s4fs"
fi
uid="$(awk -F: '$1 == "s4fs" {print $3}' "$passwd_file")"
gid="$(awk -F: '$1 == "s4fs" {print $4}' "$passwd_file")"
if [ -z "$uid" ] || [ -z "$gid" ]; then die "user s4fs is missing from $passwd_file"; fi

# --- directories ----------------------------------------------------------------------
install -d -m 0755 "$root/etc/systemd/system" "$root/usr/local/bin" "$root/sbin"
install -d -m 0750 -o 0 -g "$gid" "$root/etc/s4fs"
install -d -m 0750 -o "$uid" -g "$gid" "$root/var/cache/s4fs" "$root/var/lib/s4fs"
if mountpoint -q "$root$mountpoint" 2>/dev/null; then
    say "$mountpoint is mounted now; leaving it as it is"
else
    install -d -m 0755 -o "$uid" -g "$gid" "$root$mountpoint"
fi
case "$store" in
    /*) install -d -m 0750 -o "$uid" -g "$gid" "$root$store" ;;
    file:///*) install -d -m 0750 -o "$uid" -g "$gid" "$root${store#file://}" ;;
esac

# --- the config -----------------------------------------------------------------------
config="$root/etc/s4fs/config.toml"
if [ -e "$config" ] && [ "$force_config" = 0 ]; then
    say "keeping the existing $config (--force-config replaces it)"
else
    enabled=false
    [ -z "$product_code" ] || enabled=true
    manage=true
    [ "$mount_unit" = 0 ] || manage=false
    tmp="$(mktemp "$root/etc/s4fs/.config.XXXXXX")"
    sed -e "s|^store = .*|store = \"$(sed_escape "$store")\"|" \
        -e "s|^mountpoint = .*|mountpoint = \"$(sed_escape "$mountpoint")\"|" \
        -e "s|^enabled = .*|enabled = $enabled|" \
        -e "s|^product_code = .*|product_code = \"$(sed_escape "$product_code")\"|" \
        -e "s|^public_key_version = .*|public_key_version = $public_key_version|" \
        -e "s|^manage_mount = .*|manage_mount = $manage|" \
        "$here/config.example.toml" > "$tmp"
    chown "0:$gid" "$tmp"
    chmod 0640 "$tmp"
    mv -f "$tmp" "$config"
    say "wrote $config (store $store, mountpoint $mountpoint)"
fi

# --- FUSE: let the s4fs user's mount serve other users ------------------------------------
fuse_conf="$root/etc/fuse.conf"
if [ -f "$fuse_conf" ] && grep -qx '[[:space:]]*user_allow_other[[:space:]]*' "$fuse_conf"; then
    :
elif [ -f "$fuse_conf" ] && grep -qx '#[[:space:]]*user_allow_other[[:space:]]*' "$fuse_conf"; then
    sed -i 's/^#[[:space:]]*user_allow_other[[:space:]]*$/user_allow_other/' "$fuse_conf"
    say "enabled user_allow_other in /etc/fuse.conf"
else
    printf '# added by s4fs install.sh: lets the s4fs mount serve other users\nuser_allow_other\n' \
        >> "$fuse_conf"
    say "added user_allow_other to /etc/fuse.conf"
fi
command -v fusermount3 >/dev/null || say "warning: fusermount3 is missing; install it (apt-get install fuse3)"

# --- commands ---------------------------------------------------------------------------
# with --root, --s4fs-bin and the default /opt/s4fs are paths inside that root
if [ -z "$s4fs_bin" ]; then
    if [ -x "$root/opt/s4fs/bin/s4fs" ]; then
        s4fs_bin=/opt/s4fs/bin/s4fs             # where deploy/image puts it
    elif [ -z "$root" ]; then
        s4fs_bin="$(command -v s4fs || true)"
    fi
fi
if [ -z "$s4fs_bin" ] || [ ! -x "$root$s4fs_bin" ]; then
    die "cannot find the s4fs command; install s4fs first or pass --s4fs-bin PATH"
fi
helper="$(dirname "$s4fs_bin")/mount.fuse.s4fs"
link() {    # link TARGET NAME, unless NAME points at TARGET already
    if [ "$(readlink "$2" 2>/dev/null)" != "$1" ] && [ "$2" != "$root$1" ]; then
        ln -sfn "$1" "$2"
        say "linked ${2#"$root"} -> $1"
    fi
}
link "$s4fs_bin" "$root/usr/local/bin/s4fs"
if [ -x "$root$helper" ]; then
    link "$helper" "$root/sbin/mount.fuse.s4fs"
else
    say "warning: $helper is missing; mount -t fuse.s4fs and the mount unit need it"
fi

# --- units ----------------------------------------------------------------------------
install -m 0644 "$repo/systemd/s4fs-runner.service" "$root/etc/systemd/system/s4fs-runner.service"
units=(s4fs-runner.service)
dropin="$root/etc/systemd/system/s4fs-runner.service.d/passthrough.conf"
if [ "$passthrough" = 1 ]; then
    install -d -m 0755 "$(dirname "$dropin")"
    install -m 0644 "$repo/systemd/s4fs-runner.service.d/passthrough.conf" "$dropin"
    say "installed s4fs-runner.service.d/passthrough.conf (the runner's mount may use FUSE passthrough: CAP_SYS_ADMIN)"
elif [ -e "$dropin" ]; then
    say "keeping ${dropin#"$root"} from an earlier --passthrough (remove it to turn passthrough off)"
fi
if [ "$mount_unit" = 1 ]; then
    if command -v systemd-escape >/dev/null; then
        unit="$(systemd-escape --path --suffix=mount "$mountpoint")"
    else
        [ "$mountpoint" = /mnt/s4 ] || die "systemd-escape is needed to name the mount unit for $mountpoint"
        unit=mnt-s4.mount
    fi
    sed -e "s|^What=.*|What=$(sed_escape "$store")|" \
        -e "s|^Where=.*|Where=$mountpoint|" \
        -e "s|at /mnt/s4\$|at $mountpoint|" \
        "$repo/systemd/mnt-s4.mount" > "$root/etc/systemd/system/$unit"
    chmod 0644 "$root/etc/systemd/system/$unit"
    units+=("$unit")
    say "installed $unit (the runner will use it: manage_mount = false)"
fi

if ! command -v systemctl >/dev/null; then
    say "systemctl is missing; enable ${units[*]} yourself"
elif [ -n "$root" ]; then
    systemctl --root="$root" enable "${units[@]}" >/dev/null 2>&1 ||
        die "systemctl --root=$root enable ${units[*]} failed"
    say "installed and enabled ${units[*]} in $root"
elif [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable "${units[@]}"
    if [ "$start" = 1 ]; then
        systemctl restart "${units[@]}"
        say "started ${units[*]}"
    fi
    say "enabled ${units[*]}; logs: journalctl -u s4fs-runner"
else
    systemctl enable "${units[@]}"          # works offline (image builds, chroots)
    say "enabled ${units[*]}; systemd is not running here, so they start at the next boot"
fi
