#!/usr/bin/env bash
# The dtf container image (OCI), built from the project's own .deb on a
# Debian 12 base made here: no registry, no container engine.
#
#   scripts/image.sh [--deb FILE] [--no-dataset] [--tag TAG]    (as root)
#
# 1. A Debian 12 root, debootstrap --variant=minbase plus the .deb's
#    dependencies (adduser, procps), cached beside the system test's root in
#    $DTF_SYSTEM_TEST_CACHE (default /var/cache/dtf-system-test), with the
#    Debian mirror of tests/system/run.sh (DTF_SYSTEM_TEST_MIRROR, else the
#    host's apt source).
# 2. A copy of it gets the user and group dtf (10001:10001, the numbers the
#    manifests in deploy/kubernetes run as), then the .deb (dpkg -i), and
#    dataset-fashion-mnist unless --no-dataset. The token the package's
#    postinst generated is removed: a cluster's token comes from its
#    Secret, never from an image everyone can pull. Apt's lists and caches,
#    logs and the machine's identity go too.
# 3. The root as one layer (tar sorted by name, numeric owners, mtimes
#    clamped to the last commit; not bit-for-bit reproducible: dpkg and
#    apt leave run-dependent bytes in their databases), with
#    an OCI image config (User 10001:10001, WorkingDir /var/lib/dtf) and
#    manifest, written as an OCI image layout by hand:
#      target/image/dtf-oci/              the layout (skopeo/umoci: oci:DIR:TAG)
#      target/image/dtf_<ver>_<arch>.oci.tar   the same as one archive
#    `podman load -i` / `docker load -i` / `skopeo copy oci-archive:…` take
#    the archive (podman, if installed, loads it here).
# 4. The sizes: the compressed layer, the unpacked root, the archive.
#
# --deb FILE: that package (default: target/debian/dtf_<ver>-1_<arch>.deb,
# built with `cargo deb` if missing). TAG defaults to the crate's version.
set -euo pipefail
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive

cd "$(dirname "$0")/.."
SRC=$(pwd)

CACHE=${DTF_SYSTEM_TEST_CACHE:-/var/cache/dtf-system-test}
# Bump when the recipe of the cached base changes.
BASE_RECIPE=v1
CACHED_BASE=$CACHE/image-bookworm-base-$BASE_RECIPE
BASE_PACKAGES=adduser,procps
DATASET="dataset-fashion-mnist"
DTF_UID=10001
DTF_GID=10001

# host_mirror (the host's Debian mirror, as tests/system/run.sh finds it);
# lib.sh's log and die are the system tests', replaced here.
# shellcheck source=tests/system/lib.sh
. "$SRC/tests/system/lib.sh"
log() { printf '[image] %s\n' "$*"; }
die() { printf 'image.sh: ERROR: %s\n' "$*" >&2; exit 1; }

deb=
dataset=yes
tag=
while [ $# -gt 0 ]; do
	case "$1" in
	--deb) deb=$2; shift 2 ;;
	--no-dataset) dataset=no; shift ;;
	--tag) tag=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, file owners)"
command -v debootstrap >/dev/null || {
	log "apt-get install debootstrap"
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
tag=${tag:-$version}
if [ -z "$deb" ]; then
	deb=$SRC/target/debian/dtf_${version}-1_${arch}.deb
	if [ ! -f "$deb" ]; then
		log "no $deb: cargo build --release && cargo deb --no-build"
		cargo build --release --locked -q
		cargo deb --no-build -q >/dev/null
	fi
fi
[ -f "$deb" ] || die "no package $deb"
deb=$(readlink -f "$deb")
log "package: $deb"

# --- the cached base ------------------------------------------------------


build_base() {
	local mirror tmp
	mirror=${DTF_SYSTEM_TEST_MIRROR:-$(host_mirror)}
	mkdir -p "$CACHE"
	# Built beside its final name and renamed when complete.
	tmp=$(mktemp -d "$CACHE/image-base.tmp.XXXXXX")
	chmod 0755 "$tmp"
	# shellcheck disable=SC2064 # expand $tmp now
	trap "umount -l '$tmp/proc' 2>/dev/null; rm -rf '$tmp'" EXIT
	log "debootstrap --variant=minbase bookworm from $mirror (once)"
	debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$tmp" "$mirror" \
		>"$CACHE/image-debootstrap.log" 2>&1 ||
		{ tail -n 30 "$CACHE/image-debootstrap.log" >&2; die "debootstrap failed"; }
	# The data set is downloaded once, installed per image (--no-dataset
	# leaves it out without a second base).
	cp /etc/resolv.conf "$tmp/etc/resolv.conf"
	mount -t proc proc "$tmp/proc"
	chroot "$tmp" apt-get update -qq
	chroot "$tmp" apt-get install -y -qq --download-only --no-install-recommends "$DATASET" \
		>"$CACHE/image-apt.log" 2>&1 ||
		{ cat "$CACHE/image-apt.log" >&2; die "apt-get download $DATASET failed"; }
	umount "$tmp/proc"
	rm -f "$tmp/etc/resolv.conf"
	mv -T "$tmp" "$CACHED_BASE" 2>/dev/null || rm -rf "$tmp"
	trap - EXIT
}

if [ -d "$CACHED_BASE" ]; then
	log "cached base: $CACHED_BASE"
else
	build_base
fi

# --- the image's root -------------------------------------------------------

OUT=$SRC/target/image
mkdir -p "$OUT"
WORK=$(mktemp -d "$OUT/.work.XXXXXX")
ROOT=$WORK/root
cleanup() {
	umount -l "$ROOT/proc" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

log "copying the base"
cp -a "$CACHED_BASE" "$ROOT"
mount -t proc proc "$ROOT/proc"
in_root() { chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

# Fixed numbers: Kubernetes checks runAsNonRoot against a numeric user, and
# the manifests' runAsUser/fsGroup must be this user. postinst then finds it.
in_root groupadd --gid "$DTF_GID" dtf
in_root useradd --no-create-home --uid "$DTF_UID" --gid dtf --home-dir /var/lib/dtf \
	--shell /usr/sbin/nologin --comment "dtf training daemons" dtf
cp "$deb" "$ROOT/tmp/dtf.deb"
log "dpkg -i $(basename "$deb")"
in_root dpkg -i /tmp/dtf.deb >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log" >&2; die "dpkg -i failed"; }
if [ "$dataset" = yes ]; then
	log "apt-get install $DATASET (from the base's cache)"
	in_root apt-get install -y -qq --no-download --no-install-recommends "$DATASET" >"$WORK/apt.log" 2>&1 ||
		{ cat "$WORK/apt.log" >&2; die "apt-get install $DATASET failed"; }
fi
in_root dtf --version >/dev/null || die "dtf --version fails in the image's root"
umount "$ROOT/proc"

# What must not ship: the token postinst generated (every pull of the image
# would share it), apt's lists and caches, logs, the machine's identity.
rm -f "$ROOT/etc/dtf/token" "$ROOT/tmp/dtf.deb"
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/var/cache/debconf/*-old \
	"$ROOT"/var/lib/dpkg/*-old "$ROOT"/var/log/* "$ROOT"/tmp/* "$ROOT"/var/tmp/*
: >"$ROOT/etc/machine-id"
rm -f "$ROOT/etc/hostname" "$ROOT/etc/resolv.conf"
# checkpoint.dir's default, for a container run without a volume there.
install -d -o "$DTF_UID" -g "$DTF_GID" -m 0750 "$ROOT/var/lib/dtf/checkpoints"
[ ! -e "$ROOT/etc/dtf/token" ] || die "the image's root still has /etc/dtf/token"

# --- the OCI layout ---------------------------------------------------------

epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
goarch=$(case "$arch" in amd64) echo amd64 ;; arm64) echo arm64 ;; *) echo "$arch" ;; esac)
LAYOUT=$OUT/dtf-oci
rm -rf "$LAYOUT"
mkdir -p "$LAYOUT/blobs/sha256"

log "layer: tar of the root"
tar --create --file "$WORK/layer.tar" --directory "$ROOT" --sort=name --numeric-owner \
	--mtime="@$epoch" --clamp-mtime --xattrs --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* .
diff_id=$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1)
gzip -9 -n <"$WORK/layer.tar" >"$WORK/layer.tar.gz"
layer=$(sha256sum "$WORK/layer.tar.gz" | cut -d' ' -f1)
layer_size=$(stat -c %s "$WORK/layer.tar.gz")
unpacked=$(stat -c %s "$WORK/layer.tar")
mv "$WORK/layer.tar.gz" "$LAYOUT/blobs/sha256/$layer"

# blob FILE: moves FILE into the layout under its digest, prints "DIGEST SIZE".
blob() {
	local d s
	d=$(sha256sum "$1" | cut -d' ' -f1)
	s=$(stat -c %s "$1")
	mv "$1" "$LAYOUT/blobs/sha256/$d"
	echo "$d $s"
}

source_rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
with=
[ "$dataset" = no ] || with=", $DATASET"
cat >"$WORK/config.json" <<EOF
{"created":"$created","architecture":"$goarch","os":"linux",
"config":{"User":"$DTF_UID:$DTF_GID",
"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","LANG=C.UTF-8"],
"Cmd":["dtf","--help"],"WorkingDir":"/var/lib/dtf",
"ExposedPorts":{"2222/tcp":{},"9464/tcp":{}},
"Labels":{"org.opencontainers.image.title":"dtf","org.opencontainers.image.version":"$version",
"org.opencontainers.image.revision":"$source_rev",
"org.opencontainers.image.description":"dtf: parameter-server training daemons (dtf-ps, dtf-worker, dtf-evaluator, dtf), from dtf_${version}-1_${arch}.deb on Debian 12"}},
"rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]},
"history":[{"created":"$created","created_by":"scripts/image.sh: debootstrap bookworm minbase, dpkg -i $(basename "$deb")$with"}]}
EOF
read -r config config_size < <(blob "$WORK/config.json")

cat >"$WORK/manifest.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config","size":$config_size},
"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$layer","size":$layer_size}]}
EOF
read -r manifest manifest_size < <(blob "$WORK/manifest.json")

cat >"$LAYOUT/index.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",
"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest","size":$manifest_size,
"platform":{"architecture":"$goarch","os":"linux"},
"annotations":{"org.opencontainers.image.ref.name":"$tag","io.containerd.image.name":"localhost/dtf:$tag"}}]}
EOF
echo '{"imageLayoutVersion":"1.0.0"}' >"$LAYOUT/oci-layout"

ARCHIVE=$OUT/dtf_${version}_${arch}.oci.tar
tar --create --file "$ARCHIVE" --directory "$LAYOUT" --sort=name --numeric-owner --owner=0 --group=0 \
	--mtime="@$epoch" oci-layout index.json blobs

if command -v podman >/dev/null; then
	log "podman load -i $ARCHIVE"
	podman load -q -i "$ARCHIVE" || die "podman load failed"
fi

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
log "image localhost/dtf:$tag, manifest sha256:$manifest"
log "layout:  $LAYOUT"
log "archive: $ARCHIVE ($(mib "$(stat -c %s "$ARCHIVE")"))"
log "size: layer $(mib "$layer_size") compressed, $(mib "$unpacked") unpacked$with"
