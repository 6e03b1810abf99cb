// Package server is podvm's agent: the program that runs as PID 1 of a
// sandbox and serves the protocol described in package agent, with one
// shim process per run in flight. [Main] is all of it; the command in
// cmd/podvm-agent calls it. It runs on Linux only.
package server
