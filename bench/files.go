package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/podvm/podvm/vm"
)

// The tree the files comparison copies in and out: a source tree's shape
// (ten directories), incompressible contents.
const (
	treeFiles, treeBytes           = 1000, 100 << 20
	quickTreeFiles, quickTreeBytes = 100, 10 << 20
	treeDest                       = "/tmp/bench-tree" // in each sandbox
)

// Rows of the files comparison that are not podvm: `podman cp`, and the
// floor, a host tar piped into a host tar (the same tree to a host
// directory, no sandbox), both ways.
const (
	nameCp       = "`podman cp` (a process)"
	nameTarFloor = "`tar -c | tar -x` on the host (the floor)"
	nameRuncTar  = "`tar -c | runc exec … tar -x` and back: tar in the sandbox, no Podman"
)

// files copies the same host tree into each sandbox and out again to a
// fresh host directory: podvm's CopyDirIn and CopyDirOut on each backend
// against `podman cp` on the reference sandbox. Each way is its own
// round-robin; every alternative copies into the same sandbox path each
// time (overwriting), and out to a new host directory that it removes
// afterwards, inside its timing.
func (b *bench) files(ctx context.Context) error {
	src, out, done, err := b.tree("files")
	if err != nil {
		return err
	}
	defer done()

	in := append(b.vmAlts(func(v vm.VM) op { return treeIn(v, src) }), alt{name: nameCp, op: func(ctx context.Context) error {
		_, err := b.p.output(ctx, "cp", src+"/.", b.base+":"+treeDest)
		return err
	}}, alt{name: nameTarFloor, op: func(ctx context.Context) error {
		return hostTar(ctx, src, filepath.Join(out, "floor-in"))
	}}, b.runcAlt(nameRuncTar, func(r *runc) op {
		return func(ctx context.Context) error {
			return r.tarIn(ctx, b.base, src, treeDest)
		}
	}))
	if b.filesIn, err = measure(ctx, "files in", in, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}

	fresh := b.freshTree(out)
	outAlts := append(b.vmAlts(func(v vm.VM) op { return treeOut(v, fresh) }), alt{name: nameCp, op: fresh(func(ctx context.Context, dst string) error {
		_, err := b.p.output(ctx, "cp", b.base+":"+treeDest, dst)
		return err
	})}, alt{name: nameTarFloor, op: fresh(func(ctx context.Context, dst string) error {
		return hostTar(ctx, src, dst)
	})}, b.runcAlt(nameRuncTar, func(r *runc) op {
		return fresh(func(ctx context.Context, dst string) error { return r.tarOut(ctx, b.base, treeDest, dst) })
	}))
	b.filesOut, err = measure(ctx, "files out", outAlts, 1, b.sz.stream, b.sz.budget)
	return err
}

// tree makes the host tree of the files rows, and a directory for the
// copies out; done removes both.
func (b *bench) tree(section string) (src, out string, done func(), err error) {
	b.treeFiles, b.treeBytes = treeFiles, int64(treeBytes)
	if b.quick {
		b.treeFiles, b.treeBytes = quickTreeFiles, quickTreeBytes
	}
	if src, err = os.MkdirTemp("", "podvm-bench-tree-"); err != nil {
		return "", "", nil, err
	}
	if out, err = os.MkdirTemp("", "podvm-bench-out-"); err != nil {
		os.RemoveAll(src)
		return "", "", nil, err
	}
	done = func() { os.RemoveAll(src); os.RemoveAll(out) }
	progress(section + ": making the tree")
	if err := makeTree(src, b.treeFiles, b.treeBytes); err != nil {
		done()
		return "", "", nil, err
	}
	return src, out, done, nil
}

// treeIn is podvm's copy of the host tree src into v's treeDest.
func treeIn(v vm.VM, src string) op {
	return func(ctx context.Context) error { return vm.CopyDirIn(ctx, v, src, treeDest) }
}

// treeOut is podvm's copy of v's treeDest out to a fresh host directory.
func treeOut(v vm.VM, fresh func(copyTo func(ctx context.Context, dst string) error) op) op {
	return fresh(func(ctx context.Context, dst string) error { return vm.CopyDirOut(ctx, v, treeDest, dst) })
}

// freshTree returns ops that copy the tree into a new directory under
// out, check what came out and remove it.
func (b *bench) freshTree(out string) func(copyTo func(ctx context.Context, dst string) error) op {
	var n atomic.Int64
	return func(copyTo func(ctx context.Context, dst string) error) op {
		return func(ctx context.Context) error {
			dst := filepath.Join(out, strconv.FormatInt(n.Add(1), 10))
			defer os.RemoveAll(dst)
			if err := copyTo(ctx, dst); err != nil {
				return err
			}
			return checkTree(dst, b.treeFiles, b.treeBytes)
		}
	}
}

// hostTar copies the tree src to dst, made when missing, as `tar -C src
// -cf - . | tar -C dst -xf -`: the floor of a copy that streams a tree
// through a pipe.
func hostTar(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	c := osexec.CommandContext(ctx, "sh", "-c", `tar -C "$1" -cf - . | tar -C "$2" -xf -`, "sh", src, dst)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("tar | tar: %w: %s", err, out)
	}
	return nil
}

// tarIn is `tar -C src -cf - . | runc exec -i ID tar -C dst -xf -`: the
// tree unpacked into the sandbox's filesystem with nothing of Podman's or
// podvm's in between.
func (r *runc) tarIn(ctx context.Context, id, src, dst string) error {
	c := osexec.CommandContext(ctx, "sh", "-c", `tar -C "$1" -cf - . | "$2" --root "$3" exec "$4" tar -C "$5" -xf -`,
		"sh", src, r.bin, r.root, id, dst)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("tar | runc exec tar: %w: %s", err, out)
	}
	return nil
}

// tarOut is `runc exec ID tar -C src -cf - . | tar -C dst -xf -`.
func (r *runc) tarOut(ctx context.Context, id, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	c := osexec.CommandContext(ctx, "sh", "-c", `"$1" --root "$2" exec "$3" tar -C "$4" -cf - . | tar -C "$5" -xf -`,
		"sh", r.bin, r.root, id, src, dst)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("runc exec tar | tar: %w: %s", err, out)
	}
	return nil
}

// makeTree writes files files of random bytes, size bytes in all, in ten
// directories under dir.
func makeTree(dir string, files int, size int64) error {
	buf := make([]byte, size/int64(files))
	for i := range files {
		sub := filepath.Join(dir, "pkg"+strconv.Itoa(i%10))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		_, _ = rand.Read(buf)
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("file%04d.dat", i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// checkTree fails unless dir holds files regular files of size bytes in
// all (rounded down to whole files, as makeTree writes them).
func checkTree(dir string, files int, size int64) error {
	var n int
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		n++
		if err == nil {
			total += fi.Size()
		}
		return err
	})
	if want := size / int64(files) * int64(files); err == nil && (n != files || total != want) {
		err = fmt.Errorf("copied out %d files, %d bytes; want %d files, %d bytes", n, total, files, want)
	}
	return err
}

func (b *bench) reportFiles(w io.Writer) {
	fmt.Fprintf(w, "\n**Files**: a tree of %d files in 10 directories, %s, into a sandbox and out to a new host directory (removed afterwards, inside the timing); %s\n\n",
		b.treeFiles, mib(b.treeBytes), runs(append(b.filesIn, b.filesOut...)))
	fmt.Fprintln(w, "| how | in p50 | in MiB/s | in vs `podman cp` | out p50 | out MiB/s | out vs `podman cp` | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|")
	cell := func(ss []*series, s *series) string {
		if !s.ok() {
			return fmt.Sprintf("%s | | ", skipped(s))
		}
		vs := "–"
		if ref := find(ss, nameCp); ref != nil {
			vs = ratio(float64(s.p50()), float64(ref.p50()))
		}
		return fmt.Sprintf("%s | %.0f | %s", ms(s.p50()), mibps(b.treeBytes, s.p50()), vs)
	}
	for i, s := range b.filesIn {
		o := b.filesOut[i]
		fmt.Fprintf(w, "| %s | %s | %s | in %s, out %s |\n", s.name, cell(b.filesIn, s), cell(b.filesOut, o), failures(s), failures(o))
	}
}
