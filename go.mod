module github.com/podvm/podvm

go 1.25.0

require (
	github.com/containers/podman/v5 v5.8.3
	github.com/kevinburke/ssh_config v1.4.0
	github.com/skeema/knownhosts v1.3.2
	github.com/stretchr/testify v1.12.1
	go.podman.io/storage v1.62.0
	go.uber.org/mock v0.6.0
	golang.org/x/crypto v0.50.0
	golang.org/x/sys v0.43.0
)

require (
	github.com/BurntSushi/toml v1.5.0 // indirect
	github.com/blang/semver/v4 v4.0.0 // indirect
	github.com/coreos/go-systemd/v22 v22.6.0 // indirect
	github.com/cyphar/filepath-securejoin v0.5.2 // indirect
	github.com/docker/go-units v0.5.0 // indirect
	github.com/godbus/dbus/v5 v5.1.1-0.20241109141217-c266b19b28e9 // indirect
	github.com/hashicorp/errwrap v1.1.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/kr/fs v0.1.0 // indirect
	github.com/moby/sys/capability v0.4.0 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	github.com/moby/sys/user v0.4.0 // indirect
	github.com/moby/sys/userns v0.1.0 // indirect
	github.com/opencontainers/cgroups v0.0.6 // indirect
	github.com/opencontainers/runc v1.3.4 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	github.com/opencontainers/selinux v1.13.1 // indirect
	github.com/pkg/sftp v1.13.9 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	go.podman.io/common v0.67.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.35.0 // indirect
	golang.org/x/net v0.53.0 // indirect
	golang.org/x/sync v0.20.0 // indirect
	golang.org/x/term v0.42.0 // indirect
	golang.org/x/tools v0.43.0 // indirect
	tags.cncf.io/container-device-interface v1.0.1 // indirect
)

tool go.uber.org/mock/mockgen
