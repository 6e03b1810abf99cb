// Package readme checks that every Go sample in README.md compiles against
// the current API, so the README cannot drift from the code.
package readme

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fence finds the README's Go code blocks.
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

func TestREADMESamplesCompile(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := fence.FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 5 {
		t.Fatalf("found %d Go samples in README.md; the fence pattern is broken", len(blocks))
	}
	var src strings.Builder
	src.WriteString(prelude)
	for i, b := range blocks {
		fmt.Fprintf(&src, "\n// sample %d\nfunc sample%d(ctx context.Context, t *testing.T) {\n%s}\n", i+1, i+1, b[1])
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
		t.Errorf("README samples do not compile (sample N is the Nth ```go block):\n%s", out)
	}
}
