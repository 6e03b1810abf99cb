package agent

import (
	"bytes"
	"debug/elf"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBinary(t *testing.T) {
	t.Parallel()
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, arch := range Arches {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			b, err := Binary(arch)
			require.NoError(t, err)
			f, err := elf.NewFile(bytes.NewReader(b))
			require.NoError(t, err)
			require.Equal(t, machines[arch], f.Machine)
			require.Equal(t, elf.ET_EXEC, f.Type, "static, not position-independent")
			_, err = f.DynamicSymbols()
			require.Error(t, err, "no dynamic symbols: no cgo, no libc")
			d, err := Digest(arch)
			require.NoError(t, err)
			require.Regexp(t, `^sha256:[0-9a-f]{64}$`, d)
		})
	}
	_, err := Binary("mips")
	require.ErrorIs(t, err, ErrArch)
	_, err = Digest("mips")
	require.ErrorIs(t, err, ErrArch)
}
