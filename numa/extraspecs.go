package numa

import (
	"fmt"
	"math/big"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

// ValidateExtraSpecs checks a flavor's extra specs as Nova's API does from
// microversion 2.86: a key of a namespace Nova knows (hw:, resources:,
// trait:, quota:, ...) must be a key Nova knows, with a value of its form;
// a key of any other namespace is the operator's own and is accepted. An
// image property given in its flavor form (hw_cpu_policy) is refused too:
// Nova would take it as a key of no namespace and ignore it. The error, an
// *InvalidRequestError, names the first bad key in key order.
func ValidateExtraSpecs(specs map[string]string) error {
	for _, key := range sortedKeys(specs) {
		if err := validateExtraSpec(key, specs[key]); err != nil {
			return err
		}
	}
	return nil
}

// specKeyChars are the characters Nova's API schema allows in an extra
// spec's key, which is 1-255 of them; a value is at most 255 characters.
const specKeyChars = "letters, digits, '-', '_', ':', '.' and space"

const maxSpecLen = 255

func validSpecKey(key string) bool {
	if key == "" || utf8.RuneCountInString(key) > maxSpecLen {
		return false
	}
	for _, r := range key {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_:. ", r)
		if !ok {
			return false
		}
	}
	return true
}

func validateExtraSpec(key, value string) error {
	if !validSpecKey(key) {
		return invalid("ValidationError", "extra spec key %q: keys are 1-%d characters of %s", key, maxSpecLen, specKeyChars)
	}
	if n := utf8.RuneCountInString(value); n > maxSpecLen {
		return invalid("ValidationError", "extra spec %s: its value has %d characters; at most %d are allowed", key, n, maxSpecLen)
	}
	if r, ok := lookupSpec(key); ok {
		if allowed := r.value.check(value); allowed != "" {
			return invalid("ValidationError", "extra spec %s=%q: %s", key, value, allowed)
		}
		return nil
	}
	if _, ok := imagePropRules[key]; ok && strings.HasPrefix(key, "hw_") {
		return invalid("ValidationError", "extra spec %s=%q: that is an image property; the flavor's extra spec is %s",
			key, value, "hw:"+strings.TrimPrefix(key, "hw_"))
	}
	ns, _, found := strings.Cut(key, ":")
	if !found || !knownNamespace(ns) {
		return nil
	}
	msg := fmt.Sprintf("extra spec %s=%q: no such key in Nova's %s: namespace", key, value, ns)
	if near := nearestSpec(key); near != "" {
		msg += "; did you mean " + near + "?"
	}
	return invalid("ValidationError", "%s", msg)
}

// valueForm is the form an extra spec's or image property's value must
// have.
type valueForm struct {
	kind     valueKind
	enum     []string
	pattern  *regexp.Regexp
	form     string // the pattern or test, in words
	min, max *big.Int
	// canon turns an enum value into Nova's canonical spelling first.
	canon func(string) string
	valid func(string) bool // the test of a tested value
}

type valueKind int

const (
	anyText valueKind = iota
	enumText
	patternText
	wholeNumber
	strictBool
	testedText
	listOnly // a field Nova fills only from a list, which text is not
)

// check returns what the value should have been, or "" when it is fine.
func (f valueForm) check(v string) string {
	switch f.kind {
	case enumText:
		c := v
		if f.canon != nil {
			c = f.canon(v)
		}
		for _, e := range f.enum {
			if c == e {
				return ""
			}
		}
		return "allowed values are " + orList(f.enum)
	case patternText:
		if !f.pattern.MatchString(v) {
			return "allowed is " + f.form
		}
	case wholeNumber:
		n, ok := pythonInt(v)
		switch {
		case !ok || (f.min != nil && n.Cmp(f.min) < 0) || (f.max != nil && n.Cmp(f.max) > 0):
			return "allowed is " + f.rangeText()
		}
	case testedText:
		if !f.valid(v) {
			return "allowed is " + f.form
		}
	case listOnly:
		return "Nova takes only a list here, and a property's value is text"
	case strictBool:
		if _, ok := strictBoolValues[strings.ToLower(strings.TrimSpace(v))]; !ok {
			return "allowed is a boolean: true or false (or 1/0, yes/no, on/off, y/n, t/f)"
		}
	}
	return ""
}

func (f valueForm) rangeText() string {
	switch {
	case f.min != nil && f.max != nil:
		return fmt.Sprintf("a whole number from %s to %s", f.min, f.max)
	case f.min != nil:
		return fmt.Sprintf("a whole number of at least %s", f.min)
	}
	return "a whole number"
}

// strictBoolValues are the spellings Nova's strict boolean parsing takes,
// after trimming and lower-casing.
var strictBoolValues = map[string]bool{
	"1": true, "t": true, "true": true, "on": true, "y": true, "yes": true,
	"0": false, "f": false, "false": false, "off": false, "n": false, "no": false,
}

var pythonIntSyntax = regexp.MustCompile(`^[+-]?[0-9]+(_[0-9]+)*$`)

// pythonInt reads a whole number as Python's int() does, which is how Nova
// reads one: surrounding blanks, a sign and digit-separating underscores
// are allowed, and there is no bound.
func pythonInt(s string) (*big.Int, bool) {
	s = strings.TrimSpace(s)
	if !pythonIntSyntax.MatchString(s) {
		return nil, false
	}
	return new(big.Int).SetString(strings.ReplaceAll(s, "_", ""), 10)
}

func orList(vals []string) string {
	if len(vals) == 1 {
		return vals[0]
	}
	return strings.Join(vals[:len(vals)-1], ", ") + " or " + vals[len(vals)-1]
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// nearestSpec suggests the known key a mistyped one most likely meant: a
// key without placeholders in the same namespace, at most a few edits away.
func nearestSpec(key string) string {
	ns, _, _ := strings.Cut(key, ":")
	best, bestDist := "", 4
	for _, r := range specRules {
		if r.re != nil || !strings.HasPrefix(r.name, ns+":") {
			continue
		}
		if d := editDistance(key, r.name); d < bestDist {
			best, bestDist = r.name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
