package wire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// HelloMsg is the agent's first frame: the protocol version and how the
// agent sees itself.
type HelloMsg struct {
	Version       uint32
	PID, UID, GID uint32
	Arch          string // GOARCH of the agent binary
	GoVersion     string // the Go release that built it
	Dir           string // the agent's working directory, a run's default
}

// StartMsg asks for a run. Strings carry arbitrary bytes except NUL.
type StartMsg struct {
	Argv []string // Argv[0] is looked up in PATH unless it holds a slash
	Env  []string // KEY=VALUE entries, merged over the agent's environment
	Dir  string   // empty: the agent's working directory
	User string   // empty: the agent's user; else name, uid, uid:gid or name:group
	// TTY runs the command on a new pseudo-terminal of Rows×Cols, its
	// controlling terminal and its stdin, stdout and stderr: the run's
	// Stdout frames carry the terminal's output, and no Stderr comes.
	TTY        bool
	Rows, Cols uint16
}

// ResizeMsg sets the size of a run's terminal.
type ResizeMsg struct {
	Rows, Cols uint16
}

// Status says how a run ended.
type Status uint8

// The statuses of an ExitMsg.
const (
	Exited          Status = iota // the command ran; Code is its status
	StartNotFound                 // the command does not exist
	StartPermission               // the command (or its directory) may not be run
	StartDir                      // the working directory is missing or not a directory
	StartUser                     // the user or group is unknown
	StartFailed                   // another start failure; Msg says which
	Lost                          // the run's supervisor died; its processes were killed
	DialFailed                    // a Dial's connection failed; Code is the errno when known, Msg says why
)

// ExitMsg is a run's last frame.
type ExitMsg struct {
	Status    Status
	Code      int32  // exit status, 128+signal when a signal ended it
	Killed    bool   // the run was killed on request
	Leftovers uint32 // processes still alive after the command exited, now killed
	UserCPU   int64  // nanoseconds, every process of the run the kernel accounted
	SystemCPU int64  // nanoseconds
	PeakRSS   int64  // bytes, the largest process of the run
	Msg       string // why a start failed, or what could not be killed
}

// ByeMsg is the agent's last frame after a Shutdown.
type ByeMsg struct {
	OK  bool   // every process of every run is dead
	Msg string // otherwise, what is not
}

// StartedMsg says a run's command has started: its pid, in the
// sandbox's pid namespace, which is also its process group's.
type StartedMsg struct {
	PID uint32
}

// DialMsg asks the agent for a connection, in the sandbox's network, to
// Address: a run whose Stdin frames are written to it and whose Stdout
// frames are what it reads from it, until the sandbox's side closes it
// or the client sends Kill. Wait makes the agent try again, every few
// milliseconds, while nothing listens there yet.
type DialMsg struct {
	Network string // "tcp", "tcp4", "tcp6" or "unix"
	Address string
	Wait    bool
}

// ListenMsg asks the agent to serve more channels on TCP port Port (0:
// one the kernel picks) of the sandbox's network, each a connection that
// proves it holds Key (package psk) and then speaks this protocol from
// the agent's Hello on, as a session of its own.
type ListenMsg struct {
	Key  []byte
	Port uint16
}

// ListeningMsg answers a ListenMsg: the port the agent listens on, or
// why it does not (Err, Port 0). Addrs are the sandbox's own addresses
// (global unicast, on interfaces that are up), as its network gives
// them: a caller can dial one before the engine reports it.
type ListeningMsg struct {
	Port  uint16
	Err   string
	Addrs []string
}

// FrozenMsg is a Frozen's payload: what the sandbox holds that a
// checkpoint may not carry, for the host to name when a dump fails. TCP
// lists each TCP socket, with the process that holds it ("pid 12 (nc)
// listening on 0.0.0.0:8080").
type FrozenMsg struct {
	TCP []string
}

// ResumeMsg is a Resume's payload when the client is a new one, of a
// copy restored from a checkpoint (Fresh): the runs it adopts (Keep) go
// on with their windows full, as a new client counts them, and the
// session's other runs are killed without a word (their callers are the
// original's). An empty payload is the same client coming back, whose
// windows stand as they were.
type ResumeMsg struct {
	Fresh bool
	Keep  []uint32
}

// SignalMsg asks for a signal to a run's process group.
type SignalMsg struct {
	Signo uint8
}

// CreditMsg grants N more bytes to a stream of a run.
type CreditMsg struct {
	Stream uint8
	N      uint32
}

type enc []byte

func (e enc) u8(v uint8) enc   { return append(e, v) }
func (e enc) u32(v uint32) enc { return binary.BigEndian.AppendUint32(e, v) }
func (e enc) u64(v uint64) enc { return binary.BigEndian.AppendUint64(e, v) }
func (e enc) str(s string) enc { return append(e.u32(uint32(len(s))), s...) }
func (e enc) strs(ss []string) enc {
	e = e.u32(uint32(len(ss)))
	for _, s := range ss {
		e = e.str(s)
	}
	return e
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		if d.err == nil {
			d.err = fmt.Errorf("%w: short message", ErrProtocol)
		}
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *dec) str() string { return string(d.take(int(d.u32()))) }

func (d *dec) strs() []string {
	n := d.u32()
	if d.err != nil || uint64(n)*4 > uint64(len(d.b)) {
		d.take(math.MaxInt32) // records the error
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.str()
	}
	return ss
}

func (d *dec) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrProtocol, len(d.b))
	}
	return d.err
}

// Encode returns m's payload.
func (m HelloMsg) Encode() []byte {
	return enc(nil).u32(m.Version).u32(m.PID).u32(m.UID).u32(m.GID).str(m.Arch).str(m.GoVersion).str(m.Dir)
}

// DecodeHello parses a Hello payload.
func DecodeHello(p []byte) (HelloMsg, error) {
	d := &dec{b: p}
	m := HelloMsg{Version: d.u32(), PID: d.u32(), UID: d.u32(), GID: d.u32(), Arch: d.str(), GoVersion: d.str(), Dir: d.str()}
	return m, d.done()
}

// Encode returns m's payload.
func (m StartMsg) Encode() []byte {
	e := enc(nil).strs(m.Argv).strs(m.Env).str(m.Dir).str(m.User)
	if m.TTY {
		e = e.u8(1).u32(uint32(m.Rows)<<16 | uint32(m.Cols))
	}
	return e
}

// DecodeStart parses a Start payload.
func DecodeStart(p []byte) (StartMsg, error) {
	d := &dec{b: p}
	m := StartMsg{Argv: d.strs(), Env: d.strs(), Dir: d.str(), User: d.str()}
	if d.err == nil && len(d.b) > 0 {
		m.TTY = d.u8() == 1
		size := d.u32()
		m.Rows, m.Cols = uint16(size>>16), uint16(size)
	}
	return m, d.done()
}

// Encode returns m's payload.
func (m ResizeMsg) Encode() []byte { return enc(nil).u32(uint32(m.Rows)<<16 | uint32(m.Cols)) }

// DecodeResize parses a Resize payload.
func DecodeResize(p []byte) (ResizeMsg, error) {
	d := &dec{b: p}
	size := d.u32()
	return ResizeMsg{Rows: uint16(size >> 16), Cols: uint16(size)}, d.done()
}

// Encode returns m's payload.
func (m ExitMsg) Encode() []byte {
	k := uint8(0)
	if m.Killed {
		k = 1
	}
	return enc(nil).u8(uint8(m.Status)).u32(uint32(m.Code)).u8(k).u32(m.Leftovers).
		u64(uint64(m.UserCPU)).u64(uint64(m.SystemCPU)).u64(uint64(m.PeakRSS)).str(m.Msg)
}

// DecodeExit parses an Exit payload.
func DecodeExit(p []byte) (ExitMsg, error) {
	d := &dec{b: p}
	m := ExitMsg{Status: Status(d.u8()), Code: int32(d.u32()), Killed: d.u8() == 1, Leftovers: d.u32(),
		UserCPU: int64(d.u64()), SystemCPU: int64(d.u64()), PeakRSS: int64(d.u64()), Msg: d.str()}
	return m, d.done()
}

// Encode returns m's payload.
func (m ByeMsg) Encode() []byte {
	k := uint8(0)
	if m.OK {
		k = 1
	}
	return enc(nil).u8(k).str(m.Msg)
}

// DecodeBye parses a Bye payload.
func DecodeBye(p []byte) (ByeMsg, error) {
	d := &dec{b: p}
	m := ByeMsg{OK: d.u8() == 1, Msg: d.str()}
	return m, d.done()
}

// Encode returns m's payload.
func (m CreditMsg) Encode() []byte { return enc(nil).u8(m.Stream).u32(m.N) }

// DecodeCredit parses a Credit payload.
func DecodeCredit(p []byte) (CreditMsg, error) {
	d := &dec{b: p}
	m := CreditMsg{Stream: d.u8(), N: d.u32()}
	return m, d.done()
}

// Encode returns m's payload.
func (m StartedMsg) Encode() []byte { return enc(nil).u32(m.PID) }

// DecodeStarted parses a Started payload.
func DecodeStarted(p []byte) (StartedMsg, error) {
	d := &dec{b: p}
	m := StartedMsg{PID: d.u32()}
	return m, d.done()
}

// Encode returns m's payload.
func (m SignalMsg) Encode() []byte { return enc(nil).u8(m.Signo) }

// DecodeSignal parses a Signal payload.
func DecodeSignal(p []byte) (SignalMsg, error) {
	d := &dec{b: p}
	m := SignalMsg{Signo: d.u8()}
	return m, d.done()
}

// Encode returns m's payload.
func (m DialMsg) Encode() []byte {
	w := uint8(0)
	if m.Wait {
		w = 1
	}
	return enc(nil).str(m.Network).str(m.Address).u8(w)
}

// DecodeDial parses a Dial payload.
func DecodeDial(p []byte) (DialMsg, error) {
	d := &dec{b: p}
	m := DialMsg{Network: d.str(), Address: d.str(), Wait: d.u8() == 1}
	return m, d.done()
}

// Encode returns the payload of a Listen frame.
func (m ListenMsg) Encode() []byte { return enc(nil).str(string(m.Key)).u32(uint32(m.Port)) }

// DecodeListen parses a Listen payload.
func DecodeListen(p []byte) (ListenMsg, error) {
	d := &dec{b: p}
	m := ListenMsg{Key: []byte(d.str())}
	port := d.u32()
	m.Port = uint16(port)
	if d.err == nil && port > math.MaxUint16 {
		d.err = fmt.Errorf("%w: port %d", ErrProtocol, port)
	}
	return m, d.done()
}

// Encode returns the payload of a Frozen frame.
func (m FrozenMsg) Encode() []byte { return enc(nil).strs(m.TCP) }

// DecodeFrozen parses a Frozen payload.
func DecodeFrozen(p []byte) (FrozenMsg, error) {
	d := &dec{b: p}
	m := FrozenMsg{TCP: d.strs()}
	return m, d.done()
}

// Encode returns the payload of a Resume frame: empty unless Fresh.
func (m ResumeMsg) Encode() []byte {
	if !m.Fresh {
		return nil
	}
	e := enc(nil).u8(1).u32(uint32(len(m.Keep)))
	for _, id := range m.Keep {
		e = e.u32(id)
	}
	return e
}

// DecodeResume parses a Resume payload.
func DecodeResume(p []byte) (ResumeMsg, error) {
	if len(p) == 0 {
		return ResumeMsg{}, nil
	}
	d := &dec{b: p}
	var m ResumeMsg
	if f := d.u8(); d.err == nil && f != 1 {
		d.err = fmt.Errorf("%w: resume flag %d", ErrProtocol, f)
	}
	n := d.u32()
	if d.err == nil && uint64(n)*4 > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %d runs to keep in %d bytes", ErrProtocol, n, len(d.b))
	}
	m.Fresh = d.err == nil
	for range n {
		if d.err != nil {
			break
		}
		m.Keep = append(m.Keep, d.u32())
	}
	return m, d.done()
}

// Encode returns the payload of a Listening frame.
func (m ListeningMsg) Encode() []byte {
	return enc(nil).u32(uint32(m.Port)).str(m.Err).strs(m.Addrs)
}

// DecodeListening parses a Listening payload.
func DecodeListening(p []byte) (ListeningMsg, error) {
	d := &dec{b: p}
	port := d.u32()
	m := ListeningMsg{Port: uint16(port), Err: d.str(), Addrs: d.strs()}
	if d.err == nil && port > math.MaxUint16 {
		d.err = fmt.Errorf("%w: port %d", ErrProtocol, port)
	}
	return m, d.done()
}
