package libpod_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
)

// exportHead is the head of Podman's answer to an export: the archive
// is a file the handler copies, whose length it does not send, so the
// body is chunked (pkg/api/handlers/utils.WriteResponse, *os.File).
const exportHead = "HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/octet; charset=us-ascii\r\n" +
	"Libpod-Api-Version: 5.4.2\r\nServer: Libpod/5.4.2 (linux)\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunks encodes parts as a chunked body, ended unless cut.
func chunks(cut bool, parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&b, "%x\r\n%s\r\n", len(p), p)
	}
	if !cut {
		b.WriteString("0\r\n\r\n")
	}
	return b.String()
}

// raw answers with b as it is.
func raw(b string) libpodtest.Handler {
	return func(*libpodtest.Request) libpodtest.Answer { return libpodtest.Bytes([]byte(b)) }
}

// jsonAnswer is a complete JSON answer of status.
func jsonAnswer(status int, body string) libpodtest.Handler {
	return raw(fmt.Sprintf("HTTP/1.1 %d X\r\nContent-Type: application/json\r\nLibpod-Api-Version: 5.4.2\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body))
}

// last is the last request the service received on route.
func last(t *testing.T, svc *libpodtest.Service, route string) *libpodtest.Request {
	t.Helper()
	var r *libpodtest.Request
	for _, q := range svc.Requests() {
		if q.Route == route {
			r = q
		}
	}
	require.NotNil(t, r, "no request on %s", route)
	return r
}

const (
	exportRoute = "POST /containers/{id}/checkpoint"
	importRoute = "POST /containers/import/restore"
)

func TestContainerExport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("a", 64)
	cl, svc := connect(t, "5.4", libpodtest.Routes{exportRoute: raw(exportHead + chunks(false, "checkpoint/", strings.Repeat("x", 5000), "config.dump"))})
	var w bytes.Buffer
	require.NoError(t, cl.ContainerExport(ctx, id, true, &w))
	assert.Equal(t, "checkpoint/"+strings.Repeat("x", 5000)+"config.dump", w.String())
	r := last(t, svc, exportRoute)
	assert.Equal(t, url.Values{"export": {"true"}, "leaveRunning": {"true"}, "tcpEstablished": {"true"}, "fileLocks": {"true"}}, r.URL.Query())
	assert.Contains(t, r.URL.Path, "/containers/"+id+"/checkpoint")
	assert.Empty(t, r.Body)
}

// An archive cut short, its last chunk missing, is a dropped connection,
// not an archive.
func TestContainerExportCut(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"between chunks": chunks(true, "checkpoint/", "more"),
		"inside a chunk": chunks(true, "checkpoint/") + "800\r\nsome",
		"before any":     "",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cl, _ := connect(t, "5.4", libpodtest.Routes{exportRoute: raw(exportHead + body)})
			var w bytes.Buffer
			err := cl.ContainerExport(context.Background(), strings.Repeat("a", 64), true, &w)
			le := asError(t, err)
			assert.True(t, le.Unreachable(), "%v", err)
			assert.Equal(t, "container export", le.Op)
		})
	}
}

// A writer's own error comes back as it is, not as the service's.
func TestContainerExportWriteError(t *testing.T) {
	t.Parallel()
	cl, _ := connect(t, "5.4", libpodtest.Routes{exportRoute: raw(exportHead + chunks(false, "checkpoint/"))})
	werr := fmt.Errorf("disk full")
	err := cl.ContainerExport(context.Background(), strings.Repeat("a", 64), true, failWriter{werr})
	assert.ErrorIs(t, err, werr)
	var le *libpod.Error
	assert.False(t, errors.As(err, &le), "%v", err)
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

// A failed dump, or a missing container, is the usual error answer, and
// nothing is written.
func TestContainerExportRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status     int
		cause, msg string
	}{
		{404, "no such container", `no container with name or ID "x" found: no such container`},
		{500, "container state improper", `"x" is not running, cannot checkpoint: container state improper`},
	} {
		body := fmt.Sprintf(`{"cause":%q,"message":%q,"response":%d}`, c.cause, c.msg, c.status)
		cl, _ := connect(t, "5.4", libpodtest.Routes{exportRoute: jsonAnswer(c.status, body)})
		var w bytes.Buffer
		le := asError(t, cl.ContainerExport(context.Background(), strings.Repeat("a", 64), true, &w))
		assert.Equal(t, c.status, le.Status)
		assert.Equal(t, c.cause, le.Cause)
		assert.Equal(t, c.msg, le.Message)
		assert.Zero(t, w.Len())
	}
}

func TestContainerImport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("b", 64)
	cl, svc := connect(t, "5.4", libpodtest.Routes{importRoute: jsonAnswer(200,
		`{"Id":"`+id+`","runtime_restore_duration":912345,"criu_statistics":null}`)})
	got, err := cl.ContainerImport(ctx, strings.NewReader("an archive"))
	require.NoError(t, err)
	assert.Equal(t, id, got)
	r := last(t, svc, importRoute)
	assert.Equal(t, url.Values{"import": {"true"}, "tcpEstablished": {"true"}, "fileLocks": {"true"},
		"ignoreStaticIP": {"true"}, "ignoreStaticMAC": {"true"}}, r.URL.Query())
	assert.Equal(t, "an archive", string(r.Body))
	assert.Equal(t, "application/x-tar", r.Header.Get("Content-Type"))

	// A report that names no container is no success.
	cl, _ = connect(t, "5.4", libpodtest.Routes{importRoute: jsonAnswer(200, `{"runtime_restore_duration":1}`)})
	_, err = cl.ContainerImport(ctx, strings.NewReader("an archive"))
	le := asError(t, err)
	assert.Equal(t, 200, le.Status)
	assert.False(t, le.Unreachable())
}

func TestContainerImportRefused(t *testing.T) {
	t.Parallel()
	msg := `creating container storage: the container name "box" is already in use by ` + strings.Repeat("c", 64) + `. You have to remove that container to be able to reuse that name: that name is already in use`
	cl, _ := connect(t, "5.4", libpodtest.Routes{importRoute: jsonAnswer(500,
		fmt.Sprintf(`{"cause":"that name is already in use","message":%q,"response":500}`, msg))})
	_, err := cl.ContainerImport(context.Background(), strings.NewReader("an archive"))
	le := asError(t, err)
	assert.Equal(t, 500, le.Status)
	assert.Equal(t, "that name is already in use", le.Cause)
	assert.Equal(t, msg, le.Message)
}

// The archive is sent once, even from a *bytes.Reader, which DoRequest
// would rewind: a retry after a restore whose answer was lost would
// restore it a second time.
func TestContainerImportNotResent(t *testing.T) {
	t.Parallel()
	hangUp := func(*libpodtest.Request) libpodtest.Answer { return func(net.Conn) {} }
	for name, body := range map[string]io.Reader{
		"stream":       strings.NewReader("an archive"),
		"bytes.Reader": bytes.NewReader([]byte("an archive")),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cl, svc := connect(t, "5.4", libpodtest.Routes{importRoute: hangUp})
			_, err := cl.ContainerImport(context.Background(), body)
			assert.True(t, asError(t, err).Unreachable(), "%v", err)
			var sent []string
			for _, r := range svc.Requests() {
				if r.Route == importRoute {
					sent = append(sent, string(r.Body))
				}
			}
			require.NotEmpty(t, sent)
			assert.Equal(t, "an archive", sent[0])
			for _, b := range sent[1:] {
				assert.Empty(t, b, "a retry sent the archive again")
			}
		})
	}
}
