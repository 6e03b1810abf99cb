package vmtest

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"testing"
)

// RecordEnv names the environment variable that, set to a file's path,
// lets one [RunParity] lend what a backend observed to a later one: a
// backend named by [Recorded] has its observations of each case appended
// to the file, and a later run (another test binary, say) that names the
// same key with [Replayed] compares with them instead of running that
// backend again.
//
// make test sets it for one go test run, removing the file first: vm's
// parity records Podman's API backend, and vm/kube's parity, which runs
// after it on the same service and the same code, compares the kube
// backend with those observations rather than running every case on
// Podman a second time. A case the file lacks runs live; the file is
// only as fresh as whoever set the variable made it.
const RecordEnv = "PODVM_PARITY_RECORD"

// ParityOption configures [RunParity].
type ParityOption func(*parityOptions)

type parityOptions struct {
	keys map[string]recordKey // backend name → its record key
}

// recordKey is a backend's key in the record, and which way it goes.
type recordKey struct {
	key    string
	replay bool // take the observations from the record; else add them
}

// Recorded makes RunParity append the observations of the backend named
// backend to the file of [RecordEnv], under key: it always runs the
// backend. A key names what was observed, the same wherever it is used:
// a backend, a path and a service ("podman-api-exec").
func Recorded(backend, key string) ParityOption {
	return func(o *parityOptions) { o.keys[backend] = recordKey{key: key} }
}

// Replayed makes RunParity take the observations of the backend named
// backend from the file of [RecordEnv], under key, for each case the
// file holds, instead of running it; it runs the cases the file lacks,
// recording nothing.
func Replayed(backend, key string) ParityOption {
	return func(o *parityOptions) { o.keys[backend] = recordKey{key: key, replay: true} }
}

// record is what one backend observed of one case, or that it skipped
// it: a line of the record file, gob in base64 (gob keeps a string's
// bytes as they are, where JSON would mend those that are not UTF-8).
type record struct {
	Key     string
	Case    string
	Skipped bool
	Obs     []observation
}

// recorder reads and appends the record file of [RecordEnv].
type recorder struct {
	path string
	mu   sync.Mutex
	had  map[[2]string]record // key, case → what the file held at the start
}

// openRecorder reads the file of [RecordEnv], if set (nil if not).
func openRecorder(t *testing.T) *recorder {
	p := os.Getenv(RecordEnv)
	if p == "" {
		return nil
	}
	r, err := readRecord(p)
	if err != nil {
		t.Fatalf("vmtest: %s=%s: %v", RecordEnv, p, err)
	}
	return r
}

// readRecord reads the record file p; a missing one holds nothing yet.
func readRecord(p string) (*recorder, error) {
	r := &recorder{path: p, had: map[[2]string]record{}}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for n := 1; sc.Scan(); n++ {
		var rec record
		b, err := base64.StdEncoding.DecodeString(sc.Text())
		if err == nil {
			err = gob.NewDecoder(bytes.NewReader(b)).Decode(&rec)
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		r.had[[2]string{rec.Key, rec.Case}] = rec
	}
	return r, sc.Err()
}

// lookup returns what the file held of key's run of case c.
func (r *recorder) lookup(key, c string) (record, bool) {
	if r == nil || key == "" {
		return record{}, false
	}
	rec, ok := r.had[[2]string{key, c}]
	return rec, ok
}

// add appends rec to the file, in one write.
func (r *recorder) add(rec record) error {
	if r == nil || rec.Key == "" {
		return nil
	}
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(rec); err != nil {
		return err
	}
	line := base64.StdEncoding.AppendEncode(nil, b.Bytes())
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	return errors.Join(err, f.Close())
}

// observeRecorded runs case c on backend h in t, or, for a replayed
// key, takes what the record holds of it; it returns the observations
// (nil when the case skipped or failed) and appends a recorded key's
// live run to the record.
func observeRecorded(t *testing.T, rec *recorder, k recordKey, c testCase, h Harness, sh *shared) []observation {
	if !k.replay {
		return recordRun(t, rec, k.key, c, h, sh)
	}
	had, ok := rec.lookup(k.key, c.Name)
	switch {
	case !ok:
		return runCase(t, c, h, sh)
	case had.Skipped:
		t.Skipf("skipped where it was recorded (%s=%s, key %s)", RecordEnv, rec.path, k.key)
	}
	t.Logf("vmtest: observations recorded earlier (%s=%s, key %s)", RecordEnv, rec.path, k.key)
	return had.Obs
}

// recordRun runs case c on h and appends what it observed, or its skip,
// to the record under key (when there is a record and a key).
func recordRun(t *testing.T, rec *recorder, key string, c testCase, h Harness, sh *shared) []observation {
	if rec == nil || key == "" {
		return runCase(t, c, h, sh)
	}
	defer func() {
		// A skip ends runCase through runtime.Goexit: it is recorded here.
		if t.Skipped() && !t.Failed() {
			if err := rec.add(record{Key: key, Case: c.Name, Skipped: true}); err != nil {
				t.Errorf("vmtest: recording: %v", err)
			}
		}
	}()
	obs := runCase(t, c, h, sh)
	if !t.Failed() {
		if err := rec.add(record{Key: key, Case: c.Name, Obs: obs}); err != nil {
			t.Errorf("vmtest: recording: %v", err)
		}
	}
	return obs
}
