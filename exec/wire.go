package exec

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// commandWire is Command's JSON form. Stdin and the live writers are not
// part of it.
type commandWire struct {
	Command        string   `json:"command"`
	Args           []string `json:"args,omitempty"`
	Dir            string   `json:"dir,omitempty"`
	Env            []string `json:"env,omitempty"`
	Timeout        float64  `json:"timeout,omitempty"` // seconds
	MaxOutputBytes int      `json:"max_output_bytes,omitempty"`
}

// MarshalJSON encodes c as {"command", "args", "dir", "env", "timeout"
// (seconds), "max_output_bytes"}. Stdin, Stdout and Stderr are not encoded.
func (c Command) MarshalJSON() ([]byte, error) {
	return json.Marshal(commandWire{
		Command:        c.Name,
		Args:           c.Args,
		Dir:            c.Dir,
		Env:            c.Env,
		Timeout:        c.Timeout.Seconds(),
		MaxOutputBytes: c.MaxOutputBytes,
	})
}

// UnmarshalJSON decodes the form written by [Command.MarshalJSON]. It
// rejects a timeout that is negative or too large for a time.Duration;
// the rest of validation is left to [Command.Validate].
func (c *Command) UnmarshalJSON(data []byte) error {
	var w commandWire
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("exec: decoding command: %w", err)
	}
	if w.Timeout < 0 || w.Timeout*float64(time.Second) > math.MaxInt64 {
		return fmt.Errorf("%w: timeout %v seconds out of range", ErrInvalidCommand, w.Timeout)
	}
	*c = Command{
		Name:           w.Command,
		Args:           w.Args,
		Dir:            w.Dir,
		Env:            w.Env,
		Timeout:        time.Duration(w.Timeout * float64(time.Second)),
		MaxOutputBytes: w.MaxOutputBytes,
	}
	return nil
}

// resultWire is Result's JSON form.
type resultWire struct {
	Stdout      string  `json:"stdout"`
	Stderr      string  `json:"stderr"`
	ExitCode    int     `json:"exit_code"`
	DurationMS  float64 `json:"duration_ms"`
	TimedOut    bool    `json:"is_timeout"`
	Truncated   bool    `json:"truncated"`
	StdoutBytes int64   `json:"stdout_bytes"`
	StderrBytes int64   `json:"stderr_bytes"`
}

// MarshalJSON encodes r as {"stdout", "stderr", "exit_code",
// "duration_ms", "is_timeout", "truncated", "stdout_bytes",
// "stderr_bytes"}. Output that is not valid UTF-8 is encoded by
// encoding/json's rules (invalid bytes become U+FFFD).
func (r Result) MarshalJSON() ([]byte, error) {
	return json.Marshal(resultWire{
		Stdout:      r.Stdout,
		Stderr:      r.Stderr,
		ExitCode:    r.ExitCode,
		DurationMS:  float64(r.Duration) / float64(time.Millisecond),
		TimedOut:    r.TimedOut,
		Truncated:   r.Truncated,
		StdoutBytes: r.StdoutBytes,
		StderrBytes: r.StderrBytes,
	})
}

// UnmarshalJSON decodes the form written by [Result.MarshalJSON].
func (r *Result) UnmarshalJSON(data []byte) error {
	var w resultWire
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("exec: decoding result: %w", err)
	}
	if w.DurationMS < 0 || w.DurationMS*float64(time.Millisecond) > math.MaxInt64 {
		return fmt.Errorf("exec: decoding result: duration_ms %v out of range", w.DurationMS)
	}
	*r = Result{
		Stdout:      w.Stdout,
		Stderr:      w.Stderr,
		ExitCode:    w.ExitCode,
		Duration:    time.Duration(w.DurationMS * float64(time.Millisecond)),
		TimedOut:    w.TimedOut,
		Truncated:   w.Truncated,
		StdoutBytes: w.StdoutBytes,
		StderrBytes: w.StderrBytes,
	}
	return nil
}
