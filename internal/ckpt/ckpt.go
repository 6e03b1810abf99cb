// Package ckpt reads and rewrites the checkpoint archives Podman exports
// (`podman container checkpoint --export`, the libpod API's
// checkpoint?export=true): an uncompressed tar holding CRIU's images under
// checkpoint/, the container's config.dump and spec.dump, its layer's
// changes and a few files more.
//
// A restore from such an archive makes the container config.dump
// describes: its ID, name and labels, and the mounts of spec.dump. Podman
// has no parameter to change the labels or the mounts, and its CLI
// refuses a new name with established TCP connections, so a copy that is
// a sandbox of its own (its own ID, owner and token) is made by
// rewriting those two files on the way to the restore. Every other entry
// passes through byte for byte (from a file to a file, copied in the
// kernel), never held whole: its body is read once, by the copy, its
// header and last byte once more, by the check that plans it.
//
// The package knows the archive's layout and nothing of Podman's API.
package ckpt

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"regexp"
	"strings"
)

// The entries every archive Podman exports holds.
const (
	ConfigDump = "config.dump"              // the container's libpod configuration
	SpecDump   = "spec.dump"                // its OCI runtime spec
	Inventory  = "checkpoint/inventory.img" // CRIU's: present in every dump
)

// maxDump bounds how much of a .dump entry is read into memory: Podman's
// are a few KiB.
const maxDump = 16 << 20

// ErrInvalid is the error of an archive that is not a whole checkpoint
// (cut short, not a tar, without one of the entries every checkpoint
// holds) and of an Identity Podman would refuse.
var ErrInvalid = errors.New("ckpt: invalid checkpoint archive")

var (
	validID   = regexp.MustCompile(`^[0-9a-f]{64}$`)               // as Podman makes them
	validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`) // as Podman accepts them
)

// Info is what an archive's config.dump says of the container it was
// taken from.
type Info struct {
	ID     string            // the container's ID
	Name   string            // its name
	Image  string            // the image its root filesystem came from (rootfsImageName)
	Labels map[string]string // its labels
}

// Identity is what a restored container is given in place of the
// source's: Podman restores the ID, name and labels config.dump holds.
type Identity struct {
	// ID is the new container's ID: 64 lowercase hex digits, unique on
	// the service. Required.
	ID string
	// Name is the new container's name. Required.
	Name string
	// Labels replace the source's labels whole. Nil leaves none.
	Labels map[string]string
	// Mounts maps a mount's destination in the container to the source
	// it gets in the copy, in spec.dump (runc binds a mount at restore by
	// its destination, from whatever source the spec then names). Mounts
	// not named keep their source; a destination the spec lacks is an
	// error.
	Mounts map[string]string
}

func (id Identity) check() error {
	if !validID.MatchString(id.ID) {
		return fmt.Errorf("%w: container ID %q is not 64 lowercase hex digits", ErrInvalid, id.ID)
	}
	if !validName.MatchString(id.Name) {
		return fmt.Errorf("%w: container name %q", ErrInvalid, id.Name)
	}
	return nil
}

// Inspect reads the archive r to its end and returns what its config.dump
// says. It fails with ErrInvalid unless r is a whole archive holding
// config.dump, spec.dump and CRIU's inventory: what a restore needs.
// CRIU's page images are read past, never held.
func Inspect(r io.Reader) (Info, error) {
	var info Info
	err := walk(r, func(name string, _ *tar.Header, body io.Reader, _, _ int64) error {
		if name != ConfigDump {
			return nil
		}
		b, err := readDump(name, body)
		if err != nil {
			return err
		}
		info, err = decodeConfig(b)
		return err
	})
	return info, err
}

// decodeConfig reads what Info holds of a config.dump.
func decodeConfig(b []byte) (Info, error) {
	var c *struct {
		ID     string            `json:"id"`
		Name   string            `json:"name"`
		Image  string            `json:"rootfsImageName"`
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return Info{}, fmt.Errorf("%w: %s: %w", ErrInvalid, ConfigDump, err)
	}
	if c == nil {
		return Info{}, fmt.Errorf("%w: %s is null", ErrInvalid, ConfigDump)
	}
	return Info(*c), nil
}

// Rewrite copies the archive r to w with config.dump and spec.dump
// rewritten for id, every other entry as it came, and checks r as
// Inspect does first: it is [PlanRewrite], then [Plan.Copy] from r. r
// must not change in between (a checkpoint's archive is written once):
// one cut short meanwhile fails, and what was written of it is no
// archive, which the caller drops.
func Rewrite(w io.Writer, r io.ReadSeeker, id Identity) error {
	p, err := PlanRewrite(r, id)
	if err != nil {
		return err
	}
	_, err = p.Copy(w, r)
	return err
}

// Plan is an archive rewritten for an [Identity], as ranges of the
// source archive that pass through byte for byte (CRIU's pages, the
// layer's changes: all but a few KiB) and the rewritten entries between
// them, so that writing it copies each body once and holds none of it
// whole, and a file copies to a file in the kernel.
type Plan struct {
	parts []part
	size  int64
}

// part is a rewritten entry (its header, body and padding), or, where
// data is nil, n bytes of the source from off.
type part struct {
	data   []byte
	off, n int64
}

// PlanRewrite reads the archive r from where r is, checking it as
// [Inspect] does, and returns how to write it rewritten for id:
// config.dump and spec.dump rewritten, fields of theirs that it does not
// change kept as they were (unknown ones too), and every other entry as
// it came. It reads the two files whole and seeks past the other bodies,
// reading their last byte (a body cut short is found, CRIU's pages are
// not read).
func PlanRewrite(r io.ReadSeeker, id Identity) (*Plan, error) {
	if err := id.check(); err != nil {
		return nil, err
	}
	base, err := r.Seek(0, io.SeekCurrent) // the archive starts where r is
	if err != nil {
		return nil, err
	}
	p := new(Plan)
	err = walk(r, func(name string, h *tar.Header, body io.Reader, from, start int64) error {
		var edit func([]byte) ([]byte, error)
		switch name {
		case ConfigDump:
			edit = id.config
		case SpecDump:
			edit = id.spec
		default:
			p.pass(base+from, entryEnd(h, start)-from)
			return nil
		}
		b, err := readDump(name, body)
		if err != nil {
			return err
		}
		if b, err = edit(b); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		nh := *h
		nh.Size = int64(len(b))
		if err := tw.WriteHeader(&nh); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
		if err := tw.Flush(); err != nil { // the body's padding; no end blocks
			return err
		}
		p.add(part{data: buf.Bytes()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	p.add(part{data: make([]byte, 2*blockSize)}) // the end of the archive
	return p, nil
}

// pass adds n bytes of the source from off, joined to the range before
// when they follow it.
func (p *Plan) pass(off, n int64) {
	if k := len(p.parts) - 1; k >= 0 && p.parts[k].data == nil && p.parts[k].off+p.parts[k].n == off {
		p.parts[k].n += n
		p.size += n
		return
	}
	p.add(part{off: off, n: n})
}

func (p *Plan) add(pt part) {
	p.parts = append(p.parts, pt)
	p.size += pt.n + int64(len(pt.data))
}

// Size is the length in bytes of the rewritten archive.
func (p *Plan) Size() int64 { return p.size }

// Copy writes the rewritten archive to w, reading what passes through
// from src, the archive [PlanRewrite] read, and returns how many bytes
// it wrote. From a file to a file the kernel copies those ranges
// (copy_file_range). A src shorter than it was when planned fails with
// [ErrInvalid] and [io.ErrUnexpectedEOF], a failure to read src as it is.
func (p *Plan) Copy(w io.Writer, src io.ReadSeeker) (int64, error) {
	var written int64
	for _, pt := range p.parts {
		if pt.data != nil {
			n, err := w.Write(pt.data)
			written += int64(n)
			if err != nil {
				return written, err
			}
			continue
		}
		if _, err := src.Seek(pt.off, io.SeekStart); err != nil {
			return written, err
		}
		n, err := io.Copy(w, &io.LimitedReader{R: src, N: pt.n})
		written += n
		if err != nil {
			return written, err
		}
		if n < pt.n {
			return written, fmt.Errorf("%w: the archive was cut short since it was read: %w", ErrInvalid, io.ErrUnexpectedEOF)
		}
	}
	return written, nil
}

// padded is n rounded up to whole blocks.
func padded(n int64) int64 { return (n + blockSize - 1) / blockSize * blockSize }

// config rewrites config.dump: the ID, name and labels.
func (id Identity) config(b []byte) ([]byte, error) {
	if _, err := decodeConfig(b); err != nil { // what Inspect refuses
		return nil, err
	}
	var c map[string]json.RawMessage
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	labels := id.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range map[string]any{"id": id.ID, "name": id.Name, "labels": labels} {
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		c[k] = raw
	}
	return json.Marshal(c)
}

// spec rewrites spec.dump: the sources of the mounts id names.
func (id Identity) spec(b []byte) ([]byte, error) {
	if len(id.Mounts) == 0 {
		return b, nil
	}
	var s map[string]json.RawMessage
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	var mounts []map[string]json.RawMessage
	if err := json.Unmarshal(s["mounts"], &mounts); err != nil {
		return nil, fmt.Errorf("its mounts: %w", err)
	}
	left := maps.Clone(id.Mounts)
	for _, m := range mounts {
		var dest string
		if err := json.Unmarshal(m["destination"], &dest); err != nil {
			return nil, fmt.Errorf("a mount's destination: %w", err)
		}
		src, ok := left[dest]
		if !ok {
			continue
		}
		delete(left, dest)
		raw, err := json.Marshal(src)
		if err != nil {
			return nil, err
		}
		m["source"] = raw
	}
	for dest := range left {
		return nil, fmt.Errorf("no mount at %s", dest)
	}
	raw, err := json.Marshal(mounts)
	if err != nil {
		return nil, err
	}
	s["mounts"] = raw
	return json.Marshal(s)
}

// walk calls f for every entry of the archive r, by its cleaned name,
// then checks that r ended as a tar does (two zero blocks after the last
// entry: an archive cut between entries reads as a shorter one to
// archive/tar) and held every entry a restore needs. An entry named twice
// is refused: which one Podman would take is not for podvm to guess.
//
// f gets, besides the entry, where its first header begins in r (from:
// a long name's or extended header's comes first) and where what is
// left of it begins (start): its body, or for a PAX global header, whose
// records tar has read, the padding after them.
func walk(r io.Reader, f func(name string, h *tar.Header, body io.Reader, from, start int64) error) error {
	cr := &counter{r: r}
	tr := tar.NewReader(cr)
	seen := map[string]bool{}
	var end int64 // where the last entry's data and padding end
	var last string
	for {
		// Next moves past what f left of the last entry's body: where r
		// can seek (a file), by seeking to its last byte and reading
		// that, which tells a body cut short as reading it all would, and
		// CRIU's pages are not read.
		h, err := tr.Next()
		if err == io.EOF {
			// Two zero blocks after the last entry, and after any header
			// read since (a long name's, whose entry the cut took).
			last := max(end, padded(cr.nonZero))
			if cr.n < last+2*blockSize {
				return fmt.Errorf("%w: cut short: no end-of-archive blocks", ErrInvalid)
			}
			break
		}
		switch {
		case err == nil:
		case cr.err != nil:
			return cr.err // the reader's own failure, not the archive's
		case errors.Is(err, io.ErrUnexpectedEOF) && last != "":
			return fmt.Errorf("%w: %s cut short", ErrInvalid, last)
		default:
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		name := path.Clean("/" + h.Name)[1:]
		if seen[name] && h.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: %s twice", ErrInvalid, name)
		}
		seen[name] = true
		if sparse(h) {
			return fmt.Errorf("%w: %s is a sparse file, which Podman never writes", ErrInvalid, name)
		}
		start := cr.n // the header's end: tar reads no further ahead
		switch err := f(name, h, tr, end, start); {
		case err == nil:
		case cr.err != nil:
			return cr.err
		case errors.Is(err, io.ErrUnexpectedEOF):
			return fmt.Errorf("%w: %s cut short", ErrInvalid, name)
		default:
			return err
		}
		last = name
		end = entryEnd(h, start)
	}
	for _, need := range []string{ConfigDump, SpecDump, Inventory} {
		if !seen[need] {
			return fmt.Errorf("%w: no %s", ErrInvalid, need)
		}
	}
	return nil
}

// entryEnd is where the entry of h, whose body begins at start, ends:
// after its body and the body's padding. (A PAX global header's Next
// returns with its body read, start past it: the padding is what is
// left.)
func entryEnd(h *tar.Header, start int64) int64 { return padded(start + dataSize(h)) }

// dataSize is how many bytes of body follow h in the archive: none for
// the types that have none whatever their size says (a hard link's may
// say one). A sparse file's are fewer than its size: Podman writes none,
// and one would be refused as cut short.
func dataSize(h *tar.Header) int64 {
	switch h.Typeflag {
	case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
		return 0
	}
	return h.Size
}

// sparse reports whether h is a sparse file's, old GNU or PAX: its body
// in the archive is not its size, which a plan could not place.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// readDump reads the body of a .dump entry, refusing one too large to be
// Podman's.
func readDump(name string, body io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, maxDump+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxDump {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrInvalid, name, maxDump)
	}
	return b, nil
}

// blockSize is a tar block's.
const blockSize = 512

// counter counts what was read through it, and keeps the reader's
// failure (an end is none).
type counter struct {
	r       io.Reader
	n       int64
	nonZero int64 // where the last byte read that is not zero ends
	err     error
}

// Seek moves as the reader does, where it can seek (archive/tar skips
// an entry's body so); else it fails, and tar reads instead.
func (c *counter) Seek(offset int64, whence int) (int64, error) {
	s, ok := c.r.(io.Seeker)
	if !ok || whence != io.SeekCurrent {
		return 0, errors.ErrUnsupported
	}
	pos, err := s.Seek(offset, whence)
	if err == nil {
		c.n += offset
	}
	return pos, err
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for i := n - 1; i >= 0; i-- { // from the end: data stops it at once
		if p[i] != 0 {
			c.nonZero = c.n + int64(i) + 1
			break
		}
	}
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}
