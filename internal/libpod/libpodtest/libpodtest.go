// Package libpodtest is a fake Podman service for unit tests: it listens
// on a unix socket and answers with HTTP responses recorded from a real
// Podman 4.3 (and 5.4) service, kept in testdata/libpod and made by its
// record.sh. Answers are replayed byte for byte, and can be cut short,
// paused midway or held open, to test what a real service does only when
// it fails.
package libpodtest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Handler answers one request.
type Handler func(r *Request) Answer

// Answer writes a response on the connection; the connection is closed
// when it returns.
type Answer func(conn net.Conn)

// Request is a request the service received.
type Request struct {
	*http.Request
	// Route is the method and the path after the API prefix, 64-hex IDs
	// replaced by {id}: "POST /exec/{id}/start".
	Route string
	// Body is the request body, read whole.
	Body []byte
}

// Routes map a Route to its handler.
type Routes map[string]Handler

// Service is a fake Podman service on a unix socket.
type Service struct {
	// URI is the service's unix:// URI.
	URI string

	t      testing.TB
	routes Routes
	ln     net.Listener
	done   chan struct{}

	mu       sync.Mutex
	requests []*Request
	wg       sync.WaitGroup
	once     sync.Once
}

// Serve starts a service answering by routes, over the answers of
// [Defaults] for Podman version ("4.3" or "5.4"); it stops when the test
// ends. A request with no route fails the test and gets a 404.
func Serve(t testing.TB, version string, routes Routes) *Service {
	t.Helper()
	dir, err := os.MkdirTemp("", "podvm-fake")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{URI: "unix://" + sock, t: t, routes: Defaults(version), ln: ln, done: make(chan struct{})}
	for k, h := range routes {
		s.routes[k] = h
	}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		s.Close()
		os.RemoveAll(dir)
	})
	return s
}

// Close stops the service: its socket is gone, its held answers end.
func (s *Service) Close() {
	s.once.Do(func() {
		close(s.done)
		s.ln.Close()
		s.wg.Wait()
	})
}

// Requests returns the routes requested so far, in order.
func (s *Service) Requests() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Request(nil), s.requests...)
}

// Count returns how many requests had route.
func (s *Service) Count(route string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Route == route {
			n++
		}
	}
	return n
}

func (s *Service) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close()
			s.serve(conn)
		}()
	}
}

var apiPrefix = regexp.MustCompile(`^/v[0-9][^/]*/libpod`)
var hexID = regexp.MustCompile(`/[0-9a-f]{64}(/|$)`)

func (s *Service) serve(conn net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	body, _ := io.ReadAll(req.Body)
	path := apiPrefix.ReplaceAllString(req.URL.Path, "")
	path = hexID.ReplaceAllString(path, "/{id}$1")
	r := &Request{Request: req, Route: req.Method + " " + path, Body: body}
	s.mu.Lock()
	s.requests = append(s.requests, r)
	h, ok := s.routes[r.Route]
	s.mu.Unlock()
	if !ok {
		s.t.Errorf("libpodtest: no route for %s", r.Route)
		fmt.Fprint(conn, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	// Held answers end with the test.
	answered := make(chan struct{})
	defer close(answered)
	go func() {
		select {
		case <-s.done:
			conn.Close()
		case <-answered:
		}
	}()
	h(r)(conn)
	// End the answer, then read what the client still sends (an exec's
	// stdin) before closing: closing with unread input would reset the
	// connection under the answer.
	if uc, ok := conn.(*net.UnixConn); ok {
		uc.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	io.Copy(io.Discard, conn)
}

// ExecID is the ID of the n-th exec session created (from 1): the
// recorded answer of exec create carries it instead of its own.
func ExecID(n int) string { return fmt.Sprintf("%064x", 0xe0000+n) }

// Defaults are the answers of a healthy service of the given version
// ("4.3" or "5.4") whose container and commands all succeed: exec
// sessions print "hi" and "oops" and exit 3.
func Defaults(version string) Routes {
	ping := "ping"
	if version == "5.4" {
		ping = "ping-v5"
	}
	return Routes{
		"GET /_ping": Recorded(ping),
		"GET /info":  Recorded("info"),
		// DoRequest escapes the slashes of a name; the path has them back.
		"GET /images/localhost/podvm-test:latest/json": Recorded("image-inspect"),
		"POST /images/pull":                            Recorded("image-pull"),
		"POST /images/load":                            Recorded("image-load"),
		"POST /containers/create":                      Recorded("container-create"),
		"POST /containers/{id}/start":                  Recorded("container-start"),
		"GET /containers/{id}/json":                    Recorded("container-inspect"),
		"GET /containers/json":                         Recorded("container-list"),
		"DELETE /containers/{id}":                      Recorded("container-remove"),
		"HEAD /containers/{id}/archive":                Recorded("archive-head"),
		"PUT /containers/{id}/archive":                 Recorded("archive-put"),
		"GET /containers/{id}/archive":                 Recorded("archive-get"),
		"POST /containers/{id}/exec":                   ExecCreate(),
		"POST /exec/{id}/start":                        Recorded("exec-start-exit-3"),
		"GET /exec/{id}/json":                          Recorded("exec-start-exit-3-inspect"),
	}
}

// ExecCreate answers exec create with the recorded answer, its ID
// replaced by [ExecID] of the count of sessions created so far.
func ExecCreate() Handler {
	var mu sync.Mutex
	n := 0
	rec := Load("exec-create")
	id := regexp.MustCompile(`"Id":"[0-9a-f]{64}"`)
	return func(*Request) Answer {
		mu.Lock()
		n++
		b := id.ReplaceAll(rec, []byte(`"Id":"`+ExecID(n)+`"`))
		mu.Unlock()
		return Bytes(b)
	}
}

// Load returns the recorded response name (testdata/libpod/NAME.http).
func Load(name string) []byte {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "testdata", "libpod", name+".http"))
	if err != nil {
		panic(err)
	}
	return b
}

// Bytes answers with b, byte for byte; an answer that is not a stream
// gets "Connection: close", so that the client does not reuse the
// connection the service closes.
func Bytes(b []byte) Answer {
	return func(conn net.Conn) { conn.Write(closing(b)) }
}

func closing(b []byte) []byte {
	if bytes.HasPrefix(b, []byte("HTTP/1.1 101")) {
		return b
	}
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	return append(append(append([]byte{}, line...), "\r\nConnection: close\r\n"...), rest...)
}

// Recorded answers with the recorded response name.
func Recorded(name string) Handler {
	b := Load(name)
	return func(*Request) Answer { return Bytes(b) }
}

// Hold answers with the recorded response name and keeps the connection
// open until the client closes it or the test ends: a stream that hangs.
func Hold(name string) Handler {
	b := Load(name)
	return func(*Request) Answer {
		return func(conn net.Conn) {
			conn.Write(closing(b))
			io.Copy(io.Discard, conn)
		}
	}
}

// Silence never answers: it holds the connection open, reading nothing,
// until the client closes it or the test ends.
func Silence() Handler {
	return func(*Request) Answer {
		return func(conn net.Conn) { io.Copy(io.Discard, conn) }
	}
}

// Cut answers with the first n bytes of the recorded response name, then
// closes the connection: a service that died midway.
func Cut(name string, n int) Handler {
	b := Load(name)
	return func(*Request) Answer {
		return func(conn net.Conn) { conn.Write(closing(b)[:n]) }
	}
}

// Pause answers with the recorded response name in two parts, the first
// n bytes then the rest d later.
func Pause(name string, n int, d time.Duration) Handler {
	b := Load(name)
	return func(*Request) Answer {
		return func(conn net.Conn) {
			b := closing(b)
			conn.Write(b[:n])
			time.Sleep(d)
			conn.Write(b[n:])
		}
	}
}

// Seq answers the n-th request with the n-th handler, and every request
// after the last with the last.
func Seq(hs ...Handler) Handler {
	var mu sync.Mutex
	n := 0
	return func(r *Request) Answer {
		mu.Lock()
		h := hs[min(n, len(hs)-1)]
		n++
		mu.Unlock()
		return h(r)
	}
}

// ByExec answers a request about exec session [ExecID](n) with hs[n-1],
// and others with the last of hs.
func ByExec(hs ...Handler) Handler {
	return func(r *Request) Answer {
		for i, h := range hs {
			if strings.Contains(r.URL.Path, ExecID(i+1)) {
				return h(r)
			}
		}
		return hs[len(hs)-1](r)
	}
}

// HeaderEnd is the length of the status line and headers of the recorded
// response name: where its body, or stream, begins.
func HeaderEnd(name string) int {
	b := closing(Load(name))
	return bytes.Index(b, []byte("\r\n\r\n")) + 4
}

// Stream answers an exec start as the recorded upgrade
// exec-start-exit-3 does, its stream made of one stdout frame holding
// stdout, then closes it: a session whose output the test chooses.
func Stream(stdout string) Handler {
	head := closing(Load("exec-start-exit-3"))[:HeaderEnd("exec-start-exit-3")]
	frame := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(frame[4:], uint32(len(stdout)))
	b := append(append(append([]byte{}, head...), frame...), stdout...)
	return func(*Request) Answer { return Bytes(b) }
}
