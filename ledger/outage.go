package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// OutageError is what a command gets when the ledger's Redis stayed
// unavailable for the whole wait a client allows (Config.OutageWait). It
// says since when, in words an operator reads; Unavailable holds for it,
// and errors.Unwrap gives Redis' last answer.
type OutageError struct {
	// Where is the server, as Config.Endpoint names it.
	Where string
	Since time.Time
	Err   error
}

func (e *OutageError) Error() string {
	return fmt.Sprintf("the ledger's Redis at %s has been unavailable since %s (%s): %s",
		e.Where, e.Since.Format(time.TimeOnly), time.Since(e.Since).Round(time.Second), outageCause(e.Err))
}

func (e *OutageError) Unwrap() error { return e.Err }

// outageCause words why Redis did not answer.
func outageCause(err error) string {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		switch code, _, _ := strings.Cut(rerr.Error(), " "); code {
		case "LOADING", "EXECABORT":
			// A transaction is refused whole when a command in it found
			// the server loading its data.
			return "it is loading its data after a restart"
		case "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY":
			return "its cluster is failing over (" + code + ")"
		}
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "it refuses connections: it is down or restarting"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "it closed the connection: it is restarting"
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// passing says whether err is a Redis that will answer again by itself:
// refused or broken connections, a server loading its data (and the
// transaction it refused for that), a cluster failing over. Anything else
// is an answer, or the caller's context ending.
func passing(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		code, _, _ := strings.Cut(rerr.Error(), " ")
		switch code {
		case "LOADING", "EXECABORT", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY":
			return true
		}
		return false
	}
	var nerr net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &nerr)
}

// loading says whether err is a server loading its data.
func loading(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "LOADING")
}

// outageHook has every command and pipeline of a client wait out a Redis
// that is restarting or failing over, for up to wait, and then fail with
// an OutageError. Every ledger call may run again: its scripts are
// idempotent and a transaction Redis refused did nothing.
type outageHook struct {
	wait  time.Duration
	where string
}

func (h outageHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h outageHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.retry(ctx, func() error { return next(ctx, cmd) })
	}
}

func (h outageHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return h.retry(ctx, func() error {
			err := next(ctx, cmds)
			for _, c := range cmds {
				if err == nil && passing(c.Err()) {
					err = c.Err()
				}
			}
			return err
		})
	}
}

func (h outageHook) retry(ctx context.Context, call func() error) error {
	err := call()
	if !passing(err) {
		return err
	}
	since := time.Now()
	pause := 100 * time.Millisecond
	for {
		if time.Since(since) >= h.wait {
			return &OutageError{Where: h.where, Since: since, Err: err}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w while %w", ctx.Err(), &OutageError{Where: h.where, Since: since, Err: err})
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
		if err = call(); !passing(err) {
			return err
		}
	}
}
