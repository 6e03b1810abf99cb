# Shell functions shared by the scripts; source it.

# podvm_ended_containers PODMAN [URL]: the IDs, full and sorted, of podvm's
# containers (label io.podvm.managed) on the service at URL (without one,
# of PODMAN's local storage) made on this host (label io.podvm.owner.host)
# whose owner process (label io.podvm.owner.pid) has ended. A live owner's
# containers (a test run, a demo, a benchmark in progress, another clone's)
# and another host's are not listed. vm.Reap's rule for sandboxes without
# io.podvm.owner, simpler: a PID reused since keeps a container listed as
# live.
podvm_ended_containers() {
	host=$(hostname)
	"$1" ${2:+--url "$2"} ps -a --no-trunc --filter label=io.podvm.managed \
		--format '{{.ID}}|{{index .Labels "io.podvm.owner.pid"}}|{{index .Labels "io.podvm.owner.host"}}' |
		while IFS='|' read -r id pid owner; do
			[ "${owner:-$host}" = "$host" ] || continue # not this host's to judge
			case $pid in '' | *[!0-9]*) ;; *) [ -d "/proc/$pid" ] && continue ;; esac # any user's process
			echo "$id"
		done | sort
}

# podvm_docker_archive REF ROOTFS CONFIG OUT: writes OUT, a docker-archive
# (the format of `docker save`, read by `podman load` and `ctr images import`)
# of one image named REF whose only layer is the directory ROOTFS, owned by
# root, and whose runtime config is the JSON object CONFIG (Env, Cmd,
# Entrypoint...). No engine, no registry; the same tree gives the same bytes.
podvm_docker_archive() (
	ref=$1 rootfs=$2 config=$3 out=$4
	arch=$(dpkg --print-architecture 2>/dev/null) || case $(uname -m) in
		x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;;
	esac
	w=$(mktemp -d)
	trap 'rm -rf "$w"' EXIT
	tar -C "$rootfs" --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -cf "$w/layer.tar" .
	layer=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
	printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}\n' \
		"$arch" "$config" "$layer" >"$w/config.json"
	cfg=$(sha256sum "$w/config.json" | cut -d' ' -f1)
	mv "$w/config.json" "$w/$cfg.json"
	mkdir "$w/$layer"
	mv "$w/layer.tar" "$w/$layer/layer.tar"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]\n' "$cfg" "$ref" "$layer" >"$w/manifest.json"
	tar -C "$w" --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -cf "$out.tmp" manifest.json "$cfg.json" "$layer"
	mv "$out.tmp" "$out"
)
