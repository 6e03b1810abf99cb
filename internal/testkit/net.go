package testkit

import (
	"bufio"
	"io"
	"strings"
)

// UpperEcho serves one connection: each line it reads is written back
// upper-cased, until the connection ends; then it closes it.
func UpperEcho(c io.ReadWriteCloser) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if _, err := io.WriteString(c, strings.ToUpper(sc.Text())+"\n"); err != nil {
			return
		}
	}
}
