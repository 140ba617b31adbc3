package domain

import (
	"reflect"
	"testing"
)

// TestDefaultTags: the default envconfig applies to each Options field is
// the one New applies to a field left empty.
func TestDefaultTags(t *testing.T) {
	want := map[string]string{"Type": DefaultType, "Emulator": DefaultEmulator, "Machine": DefaultMachine}
	typ := reflect.TypeFor[Options]()
	for f := range typ.Fields() {
		def, ok := want[f.Name]
		if !ok {
			t.Errorf("Options.%s has no Default constant in this test", f.Name)
			continue
		}
		if got := f.Tag.Get("default"); got != def {
			t.Errorf("Options.%s default tag = %q, want %q, the value New applies", f.Name, got, def)
		}
	}
	wantOpts := Options{Type: DefaultType, Emulator: DefaultEmulator, Machine: DefaultMachine}
	if got := (Options{}).withDefaults(); got != wantOpts {
		t.Errorf("Options{}.withDefaults() = %+v, want %+v", got, wantOpts)
	}
}
