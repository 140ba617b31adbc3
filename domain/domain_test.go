package domain

import (
	"testing"
)

// TestDefaults: New gives a field left empty its Default constant.
func TestDefaults(t *testing.T) {
	want := Options{Type: DefaultType, Emulator: DefaultEmulator, Machine: DefaultMachine}
	if got := (Options{}).withDefaults(); got != want {
		t.Errorf("Options{}.withDefaults() = %+v, want %+v", got, want)
	}
}
