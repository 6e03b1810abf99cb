package libpod_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
)

// connect starts a fake service of version with routes and connects to it.
func connect(t *testing.T, version string, routes libpodtest.Routes) (*libpod.Client, *libpodtest.Service) {
	t.Helper()
	svc := libpodtest.Serve(t, version, routes)
	c, err := libpod.Connect(context.Background(), svc.URI)
	require.NoError(t, err)
	return c, svc
}

// asError returns err as an *libpod.Error, failing the test if it is not.
func asError(t *testing.T, err error) *libpod.Error {
	t.Helper()
	var le *libpod.Error
	require.ErrorAs(t, err, &le)
	return le
}

// The one behaviour that depends on the service's version, decided once.
func TestCanRemoveExec(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version string
		want    libpod.Version
		can     bool
	}{
		{"4.3", libpod.Version{Major: 4, Minor: 3, Patch: 1}, false},
		{"5.4", libpod.Version{Major: 5, Minor: 4, Patch: 2}, true},
	} {
		cl, _ := connect(t, c.version, nil)
		assert.Equal(t, c.want, cl.Version())
		assert.Equal(t, c.can, cl.CanRemoveExec(), c.version)
	}
	for _, c := range []struct {
		v   libpod.Version
		can bool
	}{{libpod.Version{Major: 4, Minor: 7, Patch: 9}, false}, {libpod.Version{Major: 4, Minor: 8}, true}, {libpod.Version{Major: 6}, true}} {
		assert.Equal(t, c.can, c.v.AtLeast(4, 8), c.v.String())
	}
}

func TestConnectUnreachable(t *testing.T) {
	t.Parallel()
	uri := "unix://" + t.TempDir() + "/gone.sock"
	_, err := libpod.Connect(context.Background(), uri)
	le := asError(t, err)
	assert.True(t, le.Unreachable())
	assert.Contains(t, err.Error(), uri)

	_, err = libpod.Connect(context.Background(), "")
	assert.True(t, asError(t, err).Unreachable(), "an empty URI never falls back to CONTAINER_HOST")
}

// Error answers recorded from Podman 4.3 decode into Status, Cause and
// Message.
func TestErrorAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		answer string
		route  string
		call   func(*libpod.Client) error
		status int
		cause  string
		msg    string
	}{
		{"container-start-no-such-container", "POST /containers/{id}/start",
			func(c *libpod.Client) error { return c.ContainerStart(ctx, strings.Repeat("a", 64)) },
			404, "no such container", "no container with name or ID"},
		{"container-create-name-in-use", "POST /containers/create",
			func(c *libpod.Client) error { _, err := c.ContainerCreate(ctx, &libpod.Spec{Image: "i"}); return err },
			500, "that name is already in use", "is already in use by"},
		{"container-create-image-not-known", "POST /containers/create",
			func(c *libpod.Client) error { _, err := c.ContainerCreate(ctx, &libpod.Spec{Image: "i"}); return err },
			500, "image not known", "image not known"},
		{"exec-create-not-running", "POST /containers/{id}/exec",
			func(c *libpod.Client) error {
				_, err := c.ExecCreate(ctx, strings.Repeat("a", 64), libpod.ExecConfig{})
				return err
			},
			500, "container state improper", "can only create exec sessions on running containers"},
		{"exec-inspect-no-such-session", "GET /exec/{id}/json",
			func(c *libpod.Client) error { _, err := c.ExecInspect(ctx, libpodtest.ExecID(1)); return err },
			404, "no such exec session", "no exec session with ID"},
		{"exec-start-unknown-user", "POST /exec/{id}/start",
			func(c *libpod.Client) error { _, err := c.ExecStart(ctx, libpodtest.ExecID(1)); return err },
			500, "no matching entries in passwd file", "unable to find user podvm-no-such-user"},
		// 4.3 has no such route: a plain-text 404 from the router.
		{"exec-remove", "POST /exec/{id}/remove",
			func(c *libpod.Client) error { return c.ExecRemove(ctx, libpodtest.ExecID(1), true) },
			404, "", "Not Found"},
		{"archive-put-not-a-dir", "PUT /containers/{id}/archive",
			func(c *libpod.Client) error {
				return c.ArchivePut(ctx, strings.Repeat("a", 64), "/etc/passwd", strings.NewReader(""))
			},
			500, "exists but is not a directory", "copier: put"},
		{"image-load-garbage", "POST /images/load",
			func(c *libpod.Client) error { _, err := c.ImageLoad(ctx, strings.NewReader("not a tar")); return err },
			500, "payload does not match any of the supported image formats", ""},
		// A failed pull is reported inside its 200 answer.
		{"image-pull-unreachable", "POST /images/pull",
			func(c *libpod.Client) error { return c.ImagePull(ctx, "localhost/podvm-no-such-image:latest") },
			200, "", "initializing source docker://localhost/podvm-no-such-image:latest"},
		{"image-pull-short-name", "POST /images/pull",
			func(c *libpod.Client) error { return c.ImagePull(ctx, "podvm-no-such-image") },
			200, "", "did not resolve to an alias"},
	} {
		t.Run(c.answer, func(t *testing.T) {
			t.Parallel()
			cl, _ := connect(t, "4.3", libpodtest.Routes{c.route: libpodtest.Recorded(c.answer)})
			le := asError(t, c.call(cl))
			assert.Equal(t, c.status, le.Status)
			assert.Contains(t, le.Cause, c.cause)
			assert.Contains(t, le.Message, c.msg)
			assert.False(t, le.Unreachable())
		})
	}
}

// A service gone after the connection was made, or one that dies while
// it answers, is Unreachable.
func TestUnreachableAfterConnect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, _ := connect(t, "4.3", libpodtest.Routes{
		"POST /images/pull":         libpodtest.Cut("image-pull", libpodtest.HeaderEnd("image-pull")+10),
		"GET /containers/{id}/json": libpodtest.Cut("container-inspect", libpodtest.HeaderEnd("container-inspect")+100),
	})
	assert.True(t, asError(t, cl.ImagePull(ctx, "x")).Unreachable(), "pull answer cut short")
	_, err := cl.ContainerInspect(ctx, strings.Repeat("a", 64))
	assert.True(t, asError(t, err).Unreachable(), "inspect answer cut short")

	gone := libpodtest.Serve(t, "4.3", nil)
	cl, err = libpod.Connect(ctx, gone.URI)
	require.NoError(t, err)
	require.NoError(t, cl.ContainerStart(ctx, strings.Repeat("a", 64)))
	gone.Close()
	err = cl.ContainerStart(ctx, strings.Repeat("a", 64))
	assert.True(t, asError(t, err).Unreachable(), "socket gone: %v", err)
	_, err = cl.ExecStart(ctx, libpodtest.ExecID(1))
	assert.True(t, asError(t, err).Unreachable(), "socket gone: %v", err)
}

// A streamed body is sent once: DoRequest's retry of a failed request
// must not send what is left of it.
func TestStreamedBodyIsNotResent(t *testing.T) {
	t.Parallel()
	cl, svc := connect(t, "4.3", libpodtest.Routes{"PUT /containers/{id}/archive": libpodtest.Cut("archive-put", 0)})
	err := cl.ArchivePut(context.Background(), strings.Repeat("a", 64), "/tmp", io.MultiReader(strings.NewReader("tar stream")))
	assert.True(t, asError(t, err).Unreachable())
	// DoRequest tried three times; only the first carried the stream.
	var bodies []string
	for _, r := range svc.Requests() {
		if r.Route == "PUT /containers/{id}/archive" {
			bodies = append(bodies, string(r.Body))
		}
	}
	require.NotEmpty(t, bodies)
	assert.Equal(t, "tar stream", bodies[0])
	for _, b := range bodies[1:] {
		assert.Empty(t, b, "a retry sent the stream again")
	}
}

func TestContainers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, svc := connect(t, "4.3", libpodtest.Routes{"DELETE /containers/{id}": libpodtest.Seq(
		libpodtest.Recorded("container-remove"), libpodtest.Recorded("container-remove-no-such-container"))})
	id, err := cl.ContainerCreate(ctx, &libpod.Spec{Image: "localhost/podvm-test:latest", NetNS: libpod.Namespace{Mode: "none"}})
	require.NoError(t, err)
	assert.Len(t, id, 64)
	assert.Contains(t, string(svc.Requests()[1].Body), `"netns":{"nsmode":"none"}`)
	require.NoError(t, cl.ContainerStart(ctx, id))

	info, err := cl.ContainerInspect(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "running", info.State.Status)
	assert.Equal(t, "true", info.Config.Labels["io.podvm.managed"])
	assert.Equal(t, []string{"CAP_CHOWN", "CAP_KILL"}, info.EffectiveCaps)
	assert.Equal(t, int64(1024), info.HostConfig.PidsLimit)

	ids, err := cl.ContainerList(ctx, "io.podvm.token=x")
	require.NoError(t, err)
	require.Len(t, ids, 1)
	assert.Equal(t, "running", ids[0].State, "the service's word for its state")
	q := svc.Requests()[len(svc.Requests())-1].URL.Query()
	assert.Equal(t, `{"label":["io.podvm.token=x"]}`, q.Get("filters"))
	assert.Equal(t, "true", q.Get("all"))

	require.NoError(t, cl.ContainerRemove(ctx, id))
	q = svc.Requests()[len(svc.Requests())-1].URL.Query()
	assert.Equal(t, "true", q.Get("force"))
	assert.Equal(t, "0", q.Get("timeout"))
	assert.Equal(t, 404, asError(t, cl.ContainerRemove(ctx, id)).Status)
}

func TestImages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, svc := connect(t, "4.3", libpodtest.Routes{
		"GET /images/localhost/podvm-no-such-image:latest/json": libpodtest.Recorded("image-inspect-missing"),
	})
	img, err := cl.ImageInspect(ctx, "localhost/podvm-test:latest")
	require.NoError(t, err)
	assert.NotEmpty(t, img.Architecture)
	_, err = cl.ImageInspect(ctx, "localhost/podvm-no-such-image:latest")
	assert.Equal(t, 404, asError(t, err).Status)
	assert.Contains(t, asError(t, err).Message, "failed to find image")
	require.NoError(t, cl.ImagePull(ctx, "localhost/podvm-test:latest"))
	q := svc.Requests()[len(svc.Requests())-1].URL.Query()
	assert.Equal(t, "localhost/podvm-test:latest", q.Get("reference"))
	assert.Equal(t, "always", q.Get("policy"))
	names, err := cl.ImageLoad(ctx, strings.NewReader("an archive"))
	require.NoError(t, err)
	assert.Equal(t, []string{"localhost/podvm-test:latest"}, names)
	assert.Equal(t, "an archive", string(svc.Requests()[len(svc.Requests())-1].Body))
}

func TestArchive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("a", 64)
	cl, svc := connect(t, "4.3", libpodtest.Routes{"HEAD /containers/{id}/archive": libpodtest.Seq(
		libpodtest.Recorded("archive-head"), libpodtest.Recorded("archive-head-file"), libpodtest.Recorded("archive-head-missing"))})
	st, err := cl.ArchiveStat(ctx, id, "/tmp")
	require.NoError(t, err)
	assert.True(t, st.IsDir)
	assert.Equal(t, "tmp", st.Name)
	st, err = cl.ArchiveStat(ctx, id, "/etc/passwd")
	require.NoError(t, err)
	assert.False(t, st.IsDir)
	_, err = cl.ArchiveStat(ctx, id, "/no/such/path")
	assert.Equal(t, 404, asError(t, err).Status)

	require.NoError(t, cl.ArchivePut(ctx, id, "/tmp", strings.NewReader("tar bytes")))
	put := svc.Requests()[len(svc.Requests())-1]
	assert.Equal(t, "tar bytes", string(put.Body))
	assert.Equal(t, "/tmp", put.URL.Query().Get("path"))

	rc, err := cl.ArchiveGet(ctx, id, "/tmp/record.sh")
	require.NoError(t, err)
	defer rc.Close()
	h, err := tar.NewReader(rc).Next()
	require.NoError(t, err)
	assert.Equal(t, "record.sh", h.Name)
}

func TestArchiveGetDropped(t *testing.T) {
	t.Parallel()
	cl, _ := connect(t, "4.3", libpodtest.Routes{
		"GET /containers/{id}/archive": libpodtest.Cut("archive-get", libpodtest.HeaderEnd("archive-get")+2000)})
	rc, err := libpodGet(cl)
	require.NoError(t, err)
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	assert.True(t, asError(t, err).Unreachable(), "%v", err)
}

func libpodGet(cl *libpod.Client) (io.ReadCloser, error) {
	return cl.ArchiveGet(context.Background(), strings.Repeat("a", 64), "/tmp/record.sh")
}

func TestExecSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, svc := connect(t, "5.4", libpodtest.Routes{"POST /exec/{id}/remove": libpodtest.Recorded("exec-remove-v5")})
	id, err := cl.ExecCreate(ctx, strings.Repeat("a", 64), libpod.ExecConfig{Cmd: []string{"sh", "-c", "x"}, AttachStdout: true})
	require.NoError(t, err)
	assert.Equal(t, libpodtest.ExecID(1), id)
	assert.JSONEq(t, `{"Cmd":["sh","-c","x"],"AttachStdin":false,"AttachStdout":true,"AttachStderr":false}`, string(svc.Requests()[1].Body))

	s, err := cl.ExecStart(ctx, id)
	require.NoError(t, err)
	var out, errs bytes.Buffer
	require.NoError(t, libpod.Demux(s, &out, &errs))
	require.NoError(t, s.Close())
	assert.Equal(t, "hi\n", out.String())
	assert.Equal(t, "oops\n", errs.String())
	start := svc.Requests()[2]
	assert.Equal(t, "Upgrade", start.Header.Get("Connection"))
	assert.Equal(t, "tcp", start.Header.Get("Upgrade"))

	st, err := cl.ExecInspect(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, libpod.ExecState{Running: false, ExitCode: 3}, st)

	require.NoError(t, cl.ExecRemove(ctx, id, true))
	assert.JSONEq(t, `{"Force":true}`, string(svc.Requests()[len(svc.Requests())-1].Body))
}

// ExecStart returns when ctx ends even if the service never answers.
func TestExecStartCancelled(t *testing.T) {
	t.Parallel()
	cl, _ := connect(t, "4.3", libpodtest.Routes{"POST /exec/{id}/start": libpodtest.Silence()})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := cl.ExecStart(ctx, libpodtest.ExecID(1))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// A Client done with leaves no connection, and no goroutine, behind: the
// bindings' transport alone keeps both for as long as the process. The
// fake service here keeps connections alive, as Podman does.
func TestCloseIdleConnections(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "podman.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Libpod-Api-Version", "4.3.1")
		if strings.HasSuffix(r.URL.Path, "/_ping") {
			io.WriteString(w, "OK")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"cause":"no such container","message":"no container with name or ID \"x\" found: no such container","response":404}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	before := runtime.NumGoroutine()
	for range 20 {
		c, err := libpod.Connect(context.Background(), "unix://"+sock)
		require.NoError(t, err)
		_, err = c.ContainerInspect(context.Background(), "x")
		require.Equal(t, 404, asError(t, err).Status) // the connection was used, and kept
		c.CloseIdleConnections()
	}
	after := runtime.NumGoroutine() // not in assert.Eventually: it adds its own
	for end := time.Now().Add(10 * time.Second); after > before && time.Now().Before(end); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, after, before, "goroutines left by 20 closed clients")
}

// A read the service answered with a recovered panic (Podman 4.3's image
// inspect, now and then) is asked again, twice at most; another failure,
// or a panic of a request that changes something, is not.
func TestReadAskedAgainAfterAPanic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	answer := func(status int, msg string) libpodtest.Handler {
		body := fmt.Sprintf(`{"cause":%q,"message":%q,"response":%d}`, msg, msg, status)
		raw := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, http.StatusText(status), len(body), body)
		return func(*libpodtest.Request) libpodtest.Answer { return libpodtest.Bytes([]byte(raw)) }
	}
	const route = "GET /images/localhost/podvm-test:latest/json"
	panicked := answer(500, "runtime error: invalid memory address or nil pointer dereference")
	for _, c := range []struct {
		name     string
		handler  libpodtest.Handler
		ok       bool
		requests int
	}{
		{"panics twice, then answers", libpodtest.Seq(panicked, panicked, libpodtest.Recorded("image-inspect")), true, 3},
		{"panics every time", panicked, false, 3},
		{"fails otherwise", answer(500, "layer not known"), false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl, svc := connect(t, "4.3", libpodtest.Routes{route: c.handler})
			_, err := cl.ImageInspect(ctx, "localhost/podvm-test:latest")
			if c.ok {
				require.NoError(t, err)
			} else {
				assert.Equal(t, 500, asError(t, err).Status)
			}
			assert.Equal(t, c.requests, svc.Count(route))
		})
	}
}
