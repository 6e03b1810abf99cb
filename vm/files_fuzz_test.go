package vm

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzExtractTar writes archives the way CopyDirOut does and checks what
// it promises the host: nothing is written outside the destination, not
// even through a symlink that was there before; what is written is only
// directories, regular files and symlinks, without setuid, setgid or
// sticky bits; and every symlink written resolves inside the destination
// (or nowhere). An archive is a spec, one entry a line, "type name
// [target]": d directory, f file, s symlink, h hard link, c device, p
// fifo; every name is put beneath the archive's root directory.
func FuzzExtractTar(f *testing.F) {
	for _, s := range []string{
		"d a\nf a/b\ns l a/b\nh hl a/b",
		"f ../x",
		"s l ..\nf l/x",
		"s l .\nf l/x",
		"s esc/l x\nf esc/y",
		"f esc/x",
		"d esc\nf esc/x",
		"h h esc/../../outside",
		"s a ../outside\nh b a",
		"c null\np fifo",
		"s a b\ns b/c ../..",
		"f a\nf a",
		"d a\nd a\nf a/x",
		"f /abs",
		"s ./ .\nf x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		top := t.TempDir()
		dst, secretDir := filepath.Join(top, "dst"), filepath.Join(top, "secret")
		outside := filepath.Join(top, "outside")
		for _, d := range []string{dst, secretDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(outside, []byte("untouched"), 0o644); err != nil {
			t.Fatal(err)
		}
		// A symlink out that the user left in the destination: os.Root
		// must not write through it.
		if err := os.Symlink(secretDir, filepath.Join(dst, "esc")); err != nil {
			t.Fatal(err)
		}

		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "r/", Mode: 0o755})
		for _, line := range strings.Split(spec, "\n") {
			typ, rest, _ := strings.Cut(line, " ")
			name, target, _ := strings.Cut(rest, " ")
			h := &tar.Header{Name: "r/" + name, Linkname: target, Mode: 0o6755}
			switch typ {
			case "d":
				h.Typeflag, h.Mode = tar.TypeDir, 0o755
			case "s":
				h.Typeflag = tar.TypeSymlink
			case "h":
				h.Typeflag, h.Linkname = tar.TypeLink, "r/"+target
			case "c":
				h.Typeflag = tar.TypeChar
			case "p":
				h.Typeflag = tar.TypeFifo
			default:
				h.Typeflag, h.Size = tar.TypeReg, 3
			}
			if tw.WriteHeader(h) != nil {
				continue
			}
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write([]byte("abc"))
			}
		}
		_ = tw.Close()
		_ = extractTar(&buf, dst)

		if entries, _ := os.ReadDir(top); len(entries) != 3 {
			t.Fatalf("the destination's parent holds %d entries; want dst, outside and secret", len(entries))
		}
		if b, err := os.ReadFile(outside); err != nil || string(b) != "untouched" {
			t.Fatalf("a file outside the destination changed: %q, %v", b, err)
		}
		if entries, _ := os.ReadDir(secretDir); len(entries) != 0 {
			t.Fatalf("written through the symlink that leads out: %v", entries)
		}
		err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			switch fi.Mode().Type() {
			case 0, fs.ModeDir:
			case fs.ModeSymlink:
				if p == filepath.Join(dst, "esc") {
					return nil
				}
				real, err := filepath.EvalSymlinks(p)
				if err == nil && real != dst && !strings.HasPrefix(real, dst+string(filepath.Separator)) {
					t.Fatalf("symlink %s resolves to %s, outside the destination", p, real)
				}
			default:
				t.Fatalf("%s is a %v", p, fi.Mode().Type())
			}
			if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
				t.Fatalf("%s kept mode %v", p, fi.Mode())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
