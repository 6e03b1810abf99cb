# Shell functions shared by the scripts; source it.

# podvm_ended_containers PODMAN URL: the IDs, full and sorted, of podvm's
# containers (label io.podvm.managed) on the service at URL whose owner
# process (label io.podvm.owner.pid) has ended. A live owner's containers
# (a test run, a demo, a benchmark in progress) are not listed. vm.Reap
# applies the same rule.
podvm_ended_containers() {
	"$1" --url "$2" ps -a --no-trunc --filter label=io.podvm.managed \
		--format '{{.ID}} {{index .Labels "io.podvm.owner.pid"}}' |
		while read -r id pid; do
			case $pid in '' | *[!0-9]*) ;; *) kill -0 "$pid" 2>/dev/null && continue ;; esac
			echo "$id"
		done | sort
}
