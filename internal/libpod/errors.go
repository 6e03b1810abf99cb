package libpod

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Error is a failed request. Either the service answered with an error
// (Status is its HTTP status, Cause and Message what libpod said; a pull
// that fails once its answer has begun keeps the answer's 200), or no
// answer came: the service could not be reached, or the connection failed
// or was dropped mid-answer or mid-stream (Status is 0 and Err the
// transport's error, a context's error included).
type Error struct {
	// Op names the request: "container create", "exec stream".
	Op string
	// Status is the HTTP status, 0 when the service did not answer.
	Status int
	// Cause is libpod's short cause, e.g. "no such container"; it may be
	// empty.
	Cause string
	// Message is libpod's full message, or the body of a non-JSON answer.
	Message string
	// Err is the transport's error when Status is 0.
	Err error
}

// Error returns "libpod: OP: STATUS MESSAGE", or the transport error.
func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("libpod: %s: %v", e.Op, e.Err)
	}
	msg := e.Message
	if msg == "" {
		msg = e.Cause
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Status < 300 { // an error reported inside a successful answer
		return fmt.Sprintf("libpod: %s: %s", e.Op, msg)
	}
	return fmt.Sprintf("libpod: %s: %d %s", e.Op, e.Status, msg)
}

// Unwrap returns the transport error, if any.
func (e *Error) Unwrap() error { return e.Err }

// Unreachable reports that no answer came: the service is gone, refused
// the connection, or dropped it.
func (e *Error) Unreachable() bool { return e.Status == 0 }

// maxErrorBody bounds what is read of an error answer.
const maxErrorBody = 64 << 10

// responseError decodes an error answer: libpod's JSON error model
// ({"cause", "message", "response"}), or any other body as the message (a
// route the service does not have answers a plain "404 page not found").
// It reads at most maxErrorBody bytes and does not close the body.
func responseError(op string, resp *http.Response) error {
	e := &Error{Op: op, Status: resp.StatusCode}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil && len(data) == 0 {
		e.Message = fmt.Sprintf("(reading the answer: %v)", err)
		return e
	}
	var model struct {
		Cause   string `json:"cause"`
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &model) == nil && (model.Cause != "" || model.Message != "") {
		e.Cause, e.Message = model.Cause, model.Message
		return e
	}
	e.Message = strings.TrimSpace(string(data))
	return e
}
