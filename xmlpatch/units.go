package xmlpatch

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// units are libvirt's scaled-integer units, in lower case.
var units = map[string]uint64{
	"b": 1, "bytes": 1,
	"kb": 1000, "k": 1 << 10, "kib": 1 << 10,
	"mb": 1000 * 1000, "m": 1 << 20, "mib": 1 << 20,
	"gb": 1000 * 1000 * 1000, "g": 1 << 30, "gib": 1 << 30,
	"tb": 1000 * 1000 * 1000 * 1000, "t": 1 << 40, "tib": 1 << 40,
	"pb": 1000 * 1000 * 1000 * 1000 * 1000, "p": 1 << 50, "pib": 1 << 50,
	"eb": 1000 * 1000 * 1000 * 1000 * 1000 * 1000, "e": 1 << 60, "eib": 1 << 60,
}

// ScaledBytes converts a libvirt scaled integer, a memory amount and its
// unit attribute as in <memory unit='MiB'>512</memory>, to bytes. An empty
// unit is KiB, libvirt's default; units are case-insensitive. Its error
// names the bad value or unit and what is allowed.
func ScaledBytes(value, unit string) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number of %s", value, unitName(unit))
	}
	unit = strings.TrimSpace(unit)
	mult, ok := units[strings.ToLower(unit)]
	if unit == "" {
		mult, ok = 1024, true
	}
	if !ok {
		return 0, fmt.Errorf("unit %q: allowed units are b, bytes, KB, k, KiB, MB, M, MiB, GB, G, GiB, TB, T, TiB, PB, P, PiB, EB, E, EiB", unit)
	}
	hi, lo := bits.Mul64(n, mult)
	if hi != 0 {
		return 0, fmt.Errorf("%s %s overflows 64 bits of bytes", value, unit)
	}
	return lo, nil
}

func unitName(unit string) string {
	if unit == "" {
		return "KiB"
	}
	return unit
}
