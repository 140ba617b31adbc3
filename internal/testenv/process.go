package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// errExited marks a server that exited while starting, most likely
// because another process took its port first.
var errExited = errors.New("exited")

// server is a process a helper started and watches for its exit.
type server struct {
	what string // names it in errors: "redis-server on 127.0.0.1:20001"
	log  string // the file its log goes to
	cmd  *exec.Cmd
	done chan error
}

// startServer starts cmd and calls ready until it returns nil. A process
// that exits first is reported with errExited; one that is not ready
// within timeout is killed. Both errors end with the log's last lines.
func startServer(cmd *exec.Cmd, what, log string, timeout, every time.Duration, ready func() error) (*server, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", what, err)
	}
	s := &server{what: what, log: log, cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()

	deadline := time.Now().Add(timeout)
	for {
		select {
		case err := <-s.done:
			s.cmd = nil
			return nil, fmt.Errorf("%s %w before answering (%v); log: %s", what, errExited, err, s.logTail())
		default:
		}
		err := ready()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop(syscall.SIGKILL)
			return nil, fmt.Errorf("%s did not answer within %s: %v; log: %s", what, timeout, err, s.logTail())
		}
		time.Sleep(every)
	}
}

// stop signals the server and waits for it to exit, killing it if a clean
// shutdown takes too long. Stopping a stopped server does nothing.
func (s *server) stop(sig syscall.Signal) {
	if s == nil || s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// logTail returns the last lines of the server's log on one line.
func (s *server) logTail() string {
	lines, err := lastLines(s.log, 5)
	if err != nil || len(lines) == 0 {
		return "(no log)"
	}
	return strings.Join(lines, " | ")
}

// lastLines returns the last n lines of the file at path.
func lastLines(path string, n int) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return nil, nil
	}
	lines := strings.Split(text, "\n")
	return lines[max(0, len(lines)-n):], nil
}
