package xmlpatch

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors; every error of this package wraps one of them.
var (
	// ErrMalformed marks a document that is not well-formed XML, not a
	// libvirt domain, or carries a value that cannot be read.
	ErrMalformed = errors.New("malformed domain XML")
	// ErrMismatch marks a placement that does not fit the domain: another
	// vCPU count or other guest NUMA cells.
	ErrMismatch = errors.New("placement does not match the domain")
	// ErrPlacement marks a placement that is unusable on its own.
	ErrPlacement = errors.New("unusable placement")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("xmlpatch: %w: %s", ErrMalformed, oneLine(fmt.Sprintf(format, args...)))
}

func mismatch(format string, args ...any) error {
	return fmt.Errorf("xmlpatch: %w: %s", ErrMismatch, oneLine(fmt.Sprintf(format, args...)))
}

func badPlacement(format string, args ...any) error {
	return fmt.Errorf("xmlpatch: %w: %s", ErrPlacement, oneLine(fmt.Sprintf(format, args...)))
}

// oneLine escapes control characters, so that values quoted from the
// document keep an error message on one line.
func oneLine(s string) string {
	var sb strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, r)
		default:
			sb.WriteRune(r)
		}
	}
	return sb.String()
}
