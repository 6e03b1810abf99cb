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
	MaxMemoryBytes int64    `json:"max_memory_bytes,omitempty"`
	MaxPids        int      `json:"max_pids,omitempty"`
	MaxCPUTime     float64  `json:"max_cpu_time,omitempty"` // seconds
}

// MarshalJSON encodes c as {"command", "args", "dir", "env", "timeout"
// (seconds), "max_output_bytes", "max_memory_bytes", "max_pids",
// "max_cpu_time" (seconds)}, zero fields omitted. Stdin, Stdout and Stderr
// are not encoded.
func (c Command) MarshalJSON() ([]byte, error) {
	return json.Marshal(commandWire{
		Command:        c.Name,
		Args:           c.Args,
		Dir:            c.Dir,
		Env:            c.Env,
		Timeout:        c.Timeout.Seconds(),
		MaxOutputBytes: c.MaxOutputBytes,
		MaxMemoryBytes: c.MaxMemoryBytes,
		MaxPids:        c.MaxPids,
		MaxCPUTime:     c.MaxCPUTime.Seconds(),
	})
}

// UnmarshalJSON decodes the form written by [Command.MarshalJSON]. It
// rejects a timeout or CPU time that is negative or too large for a
// time.Duration; the rest of validation is left to [Command.Validate].
func (c *Command) UnmarshalJSON(data []byte) error {
	var w commandWire
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("exec: decoding command: %w", err)
	}
	for _, d := range []struct {
		name string
		sec  float64
	}{{"timeout", w.Timeout}, {"max_cpu_time", w.MaxCPUTime}} {
		if d.sec < 0 || d.sec*float64(time.Second) > math.MaxInt64 || d.sec != d.sec {
			return fmt.Errorf("%w: %s %v seconds out of range", ErrInvalidCommand, d.name, d.sec)
		}
	}
	*c = Command{
		Name:           w.Command,
		Args:           w.Args,
		Dir:            w.Dir,
		Env:            w.Env,
		Timeout:        time.Duration(w.Timeout * float64(time.Second)),
		MaxOutputBytes: w.MaxOutputBytes,
		MaxMemoryBytes: w.MaxMemoryBytes,
		MaxPids:        w.MaxPids,
		MaxCPUTime:     time.Duration(w.MaxCPUTime * float64(time.Second)),
	}
	return nil
}

// resultWire is Result's JSON form.
type resultWire struct {
	Stdout      string     `json:"stdout"`
	Stderr      string     `json:"stderr"`
	ExitCode    int        `json:"exit_code"`
	DurationMS  float64    `json:"duration_ms"`
	TimedOut    bool       `json:"is_timeout"`
	Truncated   bool       `json:"truncated"`
	StdoutBytes int64      `json:"stdout_bytes"`
	StderrBytes int64      `json:"stderr_bytes"`
	Usage       *usageWire `json:"usage,omitempty"`
}

// usageWire is Usage's JSON form.
type usageWire struct {
	UserCPUMS   float64 `json:"user_cpu_ms"`
	SystemCPUMS float64 `json:"system_cpu_ms"`
	PeakRSS     int64   `json:"peak_rss_bytes"`
}

// MarshalJSON encodes r as {"stdout", "stderr", "exit_code",
// "duration_ms", "is_timeout", "truncated", "stdout_bytes",
// "stderr_bytes", "usage"}; "usage" ({"user_cpu_ms", "system_cpu_ms",
// "peak_rss_bytes"}) is omitted when the usage is not known. Output that is not valid UTF-8 is encoded by
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
		Usage:       r.Usage.wire(),
	})
}

func (u *Usage) wire() *usageWire {
	if u == nil {
		return nil
	}
	return &usageWire{UserCPUMS: ms(u.UserCPU), SystemCPUMS: ms(u.SystemCPU), PeakRSS: u.PeakRSS}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// duration converts milliseconds to a Duration, refusing what does not fit.
func duration(field string, ms float64) (time.Duration, error) {
	if ms < 0 || ms*float64(time.Millisecond) > math.MaxInt64 || ms != ms {
		return 0, fmt.Errorf("exec: decoding result: %s %v out of range", field, ms)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// UnmarshalJSON decodes the form written by [Result.MarshalJSON].
func (r *Result) UnmarshalJSON(data []byte) error {
	var w resultWire
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("exec: decoding result: %w", err)
	}
	d, err := duration("duration_ms", w.DurationMS)
	if err != nil {
		return err
	}
	var u *Usage
	if w.Usage != nil {
		u = &Usage{PeakRSS: w.Usage.PeakRSS}
		if u.UserCPU, err = duration("user_cpu_ms", w.Usage.UserCPUMS); err != nil {
			return err
		}
		if u.SystemCPU, err = duration("system_cpu_ms", w.Usage.SystemCPUMS); err != nil {
			return err
		}
		if u.PeakRSS < 0 {
			return fmt.Errorf("exec: decoding result: peak_rss_bytes %d out of range", u.PeakRSS)
		}
	}
	*r = Result{
		Stdout:      w.Stdout,
		Stderr:      w.Stderr,
		ExitCode:    w.ExitCode,
		Duration:    d,
		Usage:       u,
		TimedOut:    w.TimedOut,
		Truncated:   w.Truncated,
		StdoutBytes: w.StdoutBytes,
		StderrBytes: w.StderrBytes,
	}
	return nil
}
