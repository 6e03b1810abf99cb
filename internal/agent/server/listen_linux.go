package server

import (
	"errors"
	"net"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/psk"
	"github.com/podvm/podvm/internal/agent/wire"
)

// This file is how the agent serves channels over the sandbox's network
// (wire.Listen): each connection to its port that proves it holds the
// key the Listen gave (package psk) is a session of its own, beside the
// first channel. Its end kills its own runs; only the first channel's
// end ends the agent.

const (
	// maxPending bounds the connections whose handshake is under way;
	// more are closed at once.
	maxPending = 8
	// maxPeers bounds the sessions over the network at once.
	maxPeers = 64
	// peerHandshake bounds a connection's handshake.
	peerHandshake = 10 * time.Second
)

// listen opens the peers' port, once, and serves it with key.
func (a *agent) listen(key []byte, port uint16) wire.ListeningMsg {
	if len(key) != psk.KeySize {
		return wire.ListeningMsg{Err: "a key of " + strconv.Itoa(len(key)) + " bytes; want " + strconv.Itoa(psk.KeySize)}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.listener != nil {
		return wire.ListeningMsg{Err: "already listening"}
	}
	l, err := net.Listen("tcp", ":"+strconv.Itoa(int(port)))
	if err != nil {
		return wire.ListeningMsg{Err: err.Error()}
	}
	a.listener = l
	key = append([]byte(nil), key...)
	go a.acceptPeers(l, key)
	return wire.ListeningMsg{Port: uint16(l.Addr().(*net.TCPAddr).Port), Addrs: ownAddrs()}
}

// ownAddrs lists the sandbox's global unicast addresses, on interfaces
// that are up: in a pod, its IP, which the kubelet reports in the pod's
// status only at its next relist, up to a second after the container
// runs. None when they cannot be listed.
func ownAddrs() []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
				out = append(out, n.IP.String())
			}
		}
	}
	return out
}

// acceptPeers serves the peers of l until it is closed.
func (a *agent) acceptPeers(l net.Listener, key []byte) {
	pending := make(chan struct{}, maxPending)
	peers := make(chan struct{}, maxPeers)
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of fds, say: the listener is still there, and so are
			// the peers to come.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		select {
		case pending <- struct{}{}:
		default:
			c.Close()
			continue
		}
		go func() {
			sc, ok := handshakePeer(c, key)
			<-pending
			if !ok {
				return
			}
			select {
			case peers <- struct{}{}:
			default:
				sc.Close()
				return
			}
			defer func() { <-peers }()
			a.newSession(sc, sc, func() { sc.Close() }).serve()
		}()
	}
}

// peerQuiet is how long a peer may go without answering (an
// acknowledgement, a keepalive) before its session is taken for over and
// its runs killed: a caller cut off by the network is not waited for as
// long as TCP's retransmissions take to give up.
const peerQuiet = 30 * time.Second

// handshakePeer runs psk's handshake on c within peerHandshake.
func handshakePeer(c net.Conn, key []byte) (*psk.Conn, bool) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: peerQuiet / 3, Interval: peerQuiet / 6, Count: 3})
		if rc, err := tc.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(peerQuiet.Milliseconds()))
			})
		}
	}
	_ = c.SetDeadline(time.Now().Add(peerHandshake))
	sc, err := psk.Accept(c, key)
	if err != nil {
		return nil, false
	}
	_ = c.SetDeadline(time.Time{})
	return sc, true
}
