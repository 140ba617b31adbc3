package ledger

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxGuestName is the longest guest name, in characters.
const maxGuestName = 255

const guestRule = "1-255 printable characters other than '/', not starting or ending with a space"

// CheckGuestName refuses a guest name that would break a line of output
// or a domain's <name>: control characters, '/' (libvirt refuses it in
// domain names), blanks at either end (the domain XML reader trims them),
// or more than maxGuestName characters. The error wraps ErrInvalid and
// names the name and the rule.
func CheckGuestName(name string) error {
	ok := utf8.ValidString(name) && name != "" && utf8.RuneCountInString(name) <= maxGuestName &&
		strings.TrimSpace(name) == name && !strings.Contains(name, "/")
	for _, r := range name {
		ok = ok && unicode.IsPrint(r)
	}
	if !ok {
		return fmt.Errorf("guest name %s: %w: guest names are %s", quoteName(name), ErrInvalid, guestRule)
	}
	return nil
}

// quoteName quotes a name for an error line, cut short when it is long:
// a refusal stays one readable line whatever it was given.
func quoteName(s string) string {
	const keep = 64
	if len(s) <= keep {
		return fmt.Sprintf("%q", s)
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:cut], len(s))
}
