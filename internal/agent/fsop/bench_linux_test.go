package fsop

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkTarOutIn copies a tree of 1,000 files of 100 KiB (100 MiB) with
// tar-out piped into tar-in, and with `tar -c | tar -x` for comparison.
func BenchmarkTarOutIn(b *testing.B) {
	const files, size = 1000, 100 << 10
	root := b.TempDir()
	src := root + "/src"
	if err := os.Mkdir(src, 0o755); err != nil {
		b.Fatal(err)
	}
	block := make([]byte, size+files)
	for i := range block {
		block[i] = byte(rand.Uint32())
	}
	for i := range files {
		dir := fmt.Sprintf("%s/d%02d", src, i/100)
		if i%100 == 0 {
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(fmt.Sprintf("%s/f%04d", dir, i), block[i:i+size], 0o644); err != nil {
			b.Fatal(err)
		}
	}

	// Each iteration copies the tree both ways, in turn, so that load from
	// elsewhere weighs on both alike.
	var took [2]time.Duration
	runs := []func(dst string) error{
		func(dst string) error { return fsopCopy(src, dst) },
		func(dst string) error { return tarCopy(src, dst) },
	}
	if _, err := exec.LookPath("tar"); err != nil {
		b.Log("no tar: no comparison")
		runs = runs[:1]
	}
	for b.Loop() {
		for i, run := range runs {
			b.StopTimer()
			dst, err := os.MkdirTemp(root, "dst")
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			if err := run(dst); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
			b.StopTimer()
			if err := os.RemoveAll(dst); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * files * size / 1e6 / d.Seconds() }
	b.ReportMetric(mbps(took[0]), "fsop-MB/s")
	if len(runs) == 2 {
		b.ReportMetric(mbps(took[1]), "tar-MB/s")
		b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "fsop/tar")
	}
}

// fsopCopy copies the tree src into dst with tar-out piped into tar-in.
func fsopCopy(src, dst string) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	var outErr, inErr bytes.Buffer
	done := make(chan int)
	go func() {
		code := Main([]string{"tar-out", src}, nil, pw, &outErr)
		pw.Close()
		done <- code
	}()
	in := Main([]string{"tar-in", dst}, pr, nil, &inErr)
	pr.Close()
	if out := <-done; out != 0 || in != 0 {
		return fmt.Errorf("tar-out: %d %s, tar-in: %d %s", out, &outErr, in, &inErr)
	}
	return nil
}

// tarCopy copies the tree src into dst with `tar -c | tar -x`.
func tarCopy(src, dst string) error {
	out := exec.Command("tar", "-C", src, "-cf", "-", ".")
	in := exec.Command("tar", "-C", dst, "-xf", "-")
	pipe, err := out.StdoutPipe()
	if err != nil {
		return err
	}
	in.Stdin = pipe
	if err := out.Start(); err != nil {
		return err
	}
	if err := in.Run(); err != nil {
		return err
	}
	return out.Wait()
}
