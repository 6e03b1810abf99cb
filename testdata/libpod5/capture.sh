#!/bin/sh
# Records libpod responses for a podvm-like sandbox, to compare servers:
#
#   testdata/libpod5/capture.sh SOCKET API-PREFIX OUTDIR
#   testdata/libpod5/capture.sh .podvm/podman.sock v4.3.1 testdata/libpod5/4.3.1
#   testdata/libpod5/capture.sh .podvm/podman5/podman.sock v5.0.0 testdata/libpod5/5.4.2
#
# Creates one container (label io.podvm.managed, removed on exit), runs two
# exec sessions in it and writes what the server answered: version,
# container-create, container-inspect (running, then stopped), exec-create,
# exec-inspect (running, exited with 3), exec-remove-force (POST
# /exec/{id}/remove {"Force":true} on a running session, then its inspect).
set -eu
S=$1 V=$2 O=$3
mkdir -p "$O"
a() { curl -sS --unix-socket "$S" "$@"; }
j() { python3 -m json.tool; }
name=podvm-capture-$$
a "http://d/$V/libpod/version" | j >"$O/version.json"
id=$(a -X POST -H 'Content-Type: application/json' -d "{\"name\":\"$name\",\"image\":\"localhost/podvm-test:latest\",\"labels\":{\"io.podvm.managed\":\"true\"},\"init\":true,\"entrypoint\":[\"/run/podman-init\",\"-P\"],\"netns\":{\"nsmode\":\"none\"},\"work_dir\":\"/tmp\",\"env\":{\"FOO\":\"bar\"}}" "http://d/$V/libpod/containers/create" | tee "$O/container-create.json" | grep -o '"Id":"[0-9a-f]*"' | cut -d'"' -f4)
trap 'a -X DELETE "http://d/$V/libpod/containers/$id?force=true&timeout=0" >/dev/null' EXIT
a -X POST "http://d/$V/libpod/containers/$id/start" >/dev/null
a "http://d/$V/libpod/containers/$id/json" | j >"$O/container-inspect.json"
e=$(a -X POST -H 'Content-Type: application/json' -d '{"Cmd":["sleep","300"],"AttachStdout":true,"AttachStderr":true,"Env":["A=1"],"WorkingDir":"/","User":"nobody"}' "http://d/$V/libpod/containers/$id/exec" | tee "$O/exec-create.json" | grep -o '"Id":"[0-9a-f]*"' | cut -d'"' -f4)
a -X POST -H 'Content-Type: application/json' -d '{"Detach":true}' "http://d/$V/libpod/exec/$e/start" >/dev/null
sleep 0.5
a "http://d/$V/libpod/exec/$e/json" | j >"$O/exec-inspect-running.json"
e2=$(a -X POST -H 'Content-Type: application/json' -d '{"Cmd":["sh","-c","exit 3"],"AttachStdout":true,"AttachStderr":true}' "http://d/$V/libpod/containers/$id/exec" | grep -o '"Id":"[0-9a-f]*"' | cut -d'"' -f4)
a -X POST -H 'Content-Type: application/json' -d '{"Detach":false}' "http://d/$V/libpod/exec/$e2/start" >/dev/null
a "http://d/$V/libpod/exec/$e2/json" | j >"$O/exec-inspect-exited.json"
{ a -w '\nHTTP %{http_code}\n' -X POST -H 'Content-Type: application/json' -d '{"Force":true}' "http://d/$V/libpod/exec/$e/remove"; } >"$O/exec-remove-force.txt" 2>&1 || true
a -w '\nHTTP %{http_code}\n' "http://d/$V/libpod/exec/$e/json" >>"$O/exec-remove-force.txt" 2>&1 || true
a -X POST "http://d/$V/libpod/containers/$id/stop?timeout=0" >/dev/null
a "http://d/$V/libpod/containers/$id/json" | j >"$O/container-inspect-stopped.json"
