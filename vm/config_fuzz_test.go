package vm

import (
	"strings"
	"testing"

	"github.com/podvm/podvm/internal/podman"
)

// FuzzConfig checks what Validate promises the backends: a config it
// accepts turns into a podman argv where every value sits where it was
// put, none can pass for a flag, and the image is the last argument.
func FuzzConfig(f *testing.F) {
	f.Add("localhost/podvm-test:latest", "box", "/work", "/src", "/work", "1000:1000", "none", "A=1", int64(64<<20), 1.5, int64(100))
	f.Add("--privileged", "", "", "", "", "", "", "", int64(0), 0.0, int64(0))
	f.Add("a;b", "-n", "rel", "/x", "/", "root", "host", "noequals", int64(-1), -1.0, int64(-5))
	f.Add("img", "n", "/w", "/a:b", "/t", "u", "bridge", "K=v=w", int64(1), 1e9, int64(1<<40))
	f.Fuzz(func(t *testing.T, image, name, workdir, src, dst, user, network, env string, memory int64, cpus float64, pids int64) {
		cfg := Config{Image: image, Name: name, Workdir: workdir, User: user, Network: network,
			Memory: memory, CPUs: cpus, Pids: pids, Env: []string{env},
			Mounts: []Mount{{Source: src, Target: dst, ReadOnly: true}}}
		if cfg.Validate() != nil {
			return
		}
		if strings.HasPrefix(image, "-") || strings.ContainsAny(image, " ;$`\n\x00") {
			t.Fatalf("accepted image %q", image)
		}
		argv := podman.CreateArgs(cfg.withDefaults().spec())
		if argv[len(argv)-1] != image {
			t.Fatalf("the image is not the last argument: %q", argv)
		}
		for i := 1; i < len(argv)-1; i++ {
			if !strings.HasPrefix(argv[i-1], "-") && strings.HasPrefix(argv[i], "-") {
				continue // a flag after a value
			}
			if strings.HasPrefix(argv[i-1], "--") && strings.HasPrefix(argv[i], "-") && !strings.Contains(argv[i-1], "=") &&
				argv[i-1] != "--read-only" && argv[i-1] != "--read-only-tmpfs" && argv[i-1] != "--init" {
				t.Fatalf("value of %s looks like a flag: %q", argv[i-1], argv[i])
			}
		}
		for i, a := range argv {
			if a == "-v" && strings.Count(argv[i+1], ":") != 2 {
				t.Fatalf("mount spec %q does not split into source, target, ro", argv[i+1])
			}
		}
		// Each value, where it was put: the flag's argument is the field.
		d := cfg.withDefaults()
		want := map[string]string{"--name": name, "--workdir": workdir, "--user": user,
			"--network": d.Network, "--env": env, "-v": src + ":" + dst + ":ro"}
		for i := 0; i < len(argv)-1; i++ {
			if w, ok := want[argv[i]]; ok {
				if argv[i+1] != w {
					t.Fatalf("%s %q, want %q: %q", argv[i], argv[i+1], w, argv)
				}
				delete(want, argv[i])
			}
		}
		for flag, w := range want {
			if w != "" {
				t.Fatalf("%s %q is missing: %q", flag, w, argv)
			}
		}
	})
}
