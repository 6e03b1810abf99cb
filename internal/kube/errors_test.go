package kube

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/podvm/podvm/internal/driver"
	"github.com/stretchr/testify/assert"
	"golang.org/x/time/rate"
)

// A call cut by ctx's deadline matches context.DeadlineExceeded, also
// when client-go's rate limiter refused to wait past it.
func TestClassifyDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	// What client-go returns: the limiter's error, wrapped in its own.
	l := rate.NewLimiter(rate.Every(time.Hour), 1)
	l.Allow()
	werr := l.Wait(ctx) // the next token is an hour away
	limited := fmt.Errorf("client rate limiter Wait returned an error: %w", werr)
	for name, err := range map[string]error{
		"deadline":     context.DeadlineExceeded,
		"rate limiter": limited,
	} {
		got := classify("list nodes", "", err)
		assert.ErrorIs(t, got, context.DeadlineExceeded, name)
		assert.False(t, errors.Is(got, driver.ErrEngine), name)
	}
	assert.ErrorIs(t, classify("get pod", "x", errors.New("boom")), driver.ErrEngine)
}
