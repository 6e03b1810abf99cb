package server

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// tcpSockets lists the TCP sockets of the sandbox's network, each with
// the processes that hold it: what a checkpoint's dump may fail on (CRIU
// 4.1 on Linux 6.18 dumps none), for the host to name. It reads /proc,
// and lists what it can read.
func tcpSockets() []string {
	socks := map[string]string{} // inode → "listening on ADDR" / "ADDR → ADDR"
	var order []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, s := range readTCP(f) {
			if _, ok := socks[s.inode]; !ok {
				order = append(order, s.inode)
			}
			socks[s.inode] = s.desc
		}
	}
	if len(socks) == 0 {
		return nil
	}
	holders := map[string][]string{} // inode → "pid N (comm)"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, _ := os.ReadDir(p + "/fd")
		comm, _ := os.ReadFile(p + "/comm")
		who := fmt.Sprintf("pid %s (%s)", filepath.Base(p), strings.TrimSpace(string(comm)))
		for _, fd := range fds {
			l, err := os.Readlink(p + "/fd/" + fd.Name())
			inode, ok := strings.CutPrefix(l, "socket:[")
			if err != nil || !ok {
				continue
			}
			inode = strings.TrimSuffix(inode, "]")
			if _, ours := socks[inode]; ours && !slices.Contains(holders[inode], who) {
				holders[inode] = append(holders[inode], who)
			}
		}
	}
	list := make([]string, 0, len(order))
	for _, inode := range order {
		who := strings.Join(holders[inode], ", ")
		if who == "" {
			who = "no process" // closing, or of a process /proc hides
		}
		list = append(list, who+" "+socks[inode])
	}
	return list
}

type tcpSocket struct{ inode, desc string }

// readTCP reads a /proc/net/tcp-like table; nil when it cannot.
func readTCP(path string) []tcpSocket {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var list []tcpSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		local, remote := procAddr(fields[1]), procAddr(fields[2])
		var desc string
		switch fields[3] {
		case "0A":
			desc = "listening on " + local
		case "01":
			desc = "connected " + local + " → " + remote
		default:
			st, _ := strconv.ParseUint(fields[3], 16, 8)
			desc = fmt.Sprintf("in state %d, %s → %s", st, local, remote)
		}
		list = append(list, tcpSocket{inode: fields[9], desc: desc})
	}
	return list
}

// procAddr decodes an address of /proc/net/tcp{,6}: the IP as the
// kernel's 32-bit words in host order (little endian here), a colon, the
// port in hex.
func procAddr(s string) string {
	ipHex, portHex, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(ipHex)
	port, perr := strconv.ParseUint(portHex, 16, 16)
	if !ok || err != nil || perr != nil || (len(b) != 4 && len(b) != 16) {
		return s
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.LittleEndian.Uint32(b[i:]))
	}
	ip, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()
}
