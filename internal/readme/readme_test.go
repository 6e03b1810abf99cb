// Package readme checks the project's documentation against the code:
// every Go sample in README.md and docs/*.md compiles against the current
// API, and every relative link in them leads to a file (and heading) that
// exists, so the prose cannot drift from the code or from itself.
package readme

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, seen from this package's directory.
const root = "../.."

// fence finds a page's Go code blocks.
var fence = regexp.MustCompile("(?s)```go\n(.*?)```")

// prelude is what a sample may use without declaring it: the sample is
// the body of a function with ctx and t in scope, and box is a vm.VM.
const prelude = `package gen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
	"github.com/podvm/podvm/vm/vmmock"
	"github.com/podvm/podvm/vm/vmtest"
)

var (
	_ = bytes.NewReader
	_ = context.Background
	_ = errors.Is
	_ = fmt.Print
	_ = slog.Default
	_ = os.Stdout
	_ = strings.Contains
	_ = time.Second
	_ = gomock.Any
	_ = exec.Command{}
	_ = execmock.NewMockExecutor
	_ = vm.New
	_ = kube.New
	_ = vmmock.NewMockVM
	_ = vmtest.Sandbox
)

// box is the sandbox samples that are not about making one use.
var box vm.VM
`

// pages returns README.md and every docs/*.md, as paths relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md: the glob is broken")
	}
	out := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

func read(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSamplesCompile vets every Go sample of every page, each the body of
// a function of its own. Line directives make an error name the page and
// line of the sample, not the generated file's.
func TestSamplesCompile(t *testing.T) {
	var src strings.Builder
	src.WriteString(prelude)
	n := 0
	for _, page := range pages(t) {
		text := read(t, page)
		blocks := fence.FindAllStringSubmatchIndex(text, -1)
		if page == "README.md" && len(blocks) < 5 {
			t.Fatalf("found %d Go samples in README.md; the fence pattern is broken", len(blocks))
		}
		abs, err := filepath.Abs(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			n++
			line := strings.Count(text[:b[2]], "\n") + 1
			fmt.Fprintf(&src, "\nfunc sample%d(ctx context.Context, t *testing.T) {\n//line %s:%d\n%s}\n",
				n, abs, line, text[b[2]:b[3]])
		}
	}
	// A package inside the module, so the samples see podvm as users do.
	dir, err := os.MkdirTemp(".", "_gen")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "samples.go"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := osexec.Command("go", "vet", "./"+dir).CombinedOutput()
	if err != nil {
		t.Errorf("Go samples do not compile (positions are the pages' own):\n%s", out)
	}
}

var (
	// link finds inline links and images: [text](target) or
	// [text](target "title").
	link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// heading finds ATX headings.
	heading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$`)
	// code finds fenced blocks and inline code, where a link is text.
	code = regexp.MustCompile("(?s)```.*?```|`[^`\n]*`")
)

// TestLinks checks that every relative link of every page points at a
// file or directory of the repository, and its #anchor, if any, at a
// heading of the page it names.
func TestLinks(t *testing.T) {
	anchors := map[string][]string{} // page → its headings' anchors
	for _, page := range pages(t) {
		text := code.ReplaceAllString(read(t, page), "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
				if strings.HasPrefix(dest, "../") {
					t.Errorf("%s: link %q leaves the repository", page, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					t.Errorf("%s: link %q: no such file %s", page, target, dest)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: link %q: an anchor into a file that is not markdown", page, target)
				continue
			}
			if _, ok := anchors[dest]; !ok {
				anchors[dest] = headingAnchors(read(t, dest))
			}
			if !slices.Contains(anchors[dest], frag) {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", page, target, dest, frag)
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a
// markdown text: lower case, letters, digits, '-' and '_' kept, spaces
// made '-', everything else dropped; a repeated one gets -1, -2, ...
func headingAnchors(text string) []string {
	text = regexp.MustCompile("(?s)```.*?```").ReplaceAllString(text, "")
	seen := map[string]int{}
	var out []string
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, k))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

func TestHeadingAnchors(t *testing.T) {
	got := headingAnchors("# podvm\n## On Kubernetes: vm/kube\n### Containment: what holds where\n## `vm.Pool`, warm\n## Notes\n## Notes\n```sh\n# not a heading\n```\n")
	want := []string{"podvm", "on-kubernetes-vmkube", "containment-what-holds-where", "vmpool-warm", "notes", "notes-1"}
	if !slices.Equal(got, want) {
		t.Errorf("headingAnchors = %q, want %q", got, want)
	}
}

// TestDocsIndex checks that docs/README.md, the index, links every page
// of docs/, so that none is reachable only by chance.
func TestDocsIndex(t *testing.T) {
	index := read(t, "docs/README.md")
	for _, page := range pages(t) {
		name := strings.TrimPrefix(page, "docs/")
		if name == page || name == "README.md" {
			continue
		}
		if !strings.Contains(index, "]("+name+")") {
			t.Errorf("docs/README.md does not link %s", name)
		}
	}
}
