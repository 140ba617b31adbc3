package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Rates model the memory traffic of the migrations from one source host:
// how fast its network sends a guest's memory, and how fast the guest
// dirties memory already sent, which must then be sent again. With rates
// in force a migration's copy lasts as long as the rates and its policy
// make it (see Migrate), not the migrate latency: one whose guest dirties
// memory as fast as it is sent never converges.
type Rates struct {
	// TransferMiBs is how fast memory is sent, in MiB/s; more than 0.
	TransferMiBs float64 `json:"transfer_mibs"`
	// DirtyMiBs is how fast the guest dirties memory, in MiB/s.
	DirtyMiBs float64 `json:"dirty_mibs"`
}

// check validates r.
func (r Rates) check() error {
	if !(r.TransferMiBs > 0) || !(r.DirtyMiBs >= 0) {
		return fmt.Errorf("transfer %s MiB/s, dirty %s MiB/s: the transfer rate must be more than 0, the dirty rate 0 or more",
			strconv.FormatFloat(r.TransferMiBs, 'g', -1, 64), strconv.FormatFloat(r.DirtyMiBs, 'g', -1, 64))
	}
	return nil
}

// ratesField is the field of a rates hash that holds them, as
// "transfer,dirty".
const ratesField = "migrate"

// SetRates sets the rates of the migrations from host, or from every host
// when host is "". A per-host setting overrides the all-hosts one, until
// ClearRates.
func (d *Driver) SetRates(ctx context.Context, host string, r Rates) error {
	if err := r.check(); err != nil {
		return fmt.Errorf("sim: set rates of %s: %w", hostOrAll(host), err)
	}
	v := strconv.FormatFloat(r.TransferMiBs, 'g', -1, 64) + "," + strconv.FormatFloat(r.DirtyMiBs, 'g', -1, 64)
	return d.storeRates(ctx, host, v)
}

// ClearRates removes the rates SetRates set for host (or for every host,
// for ""), so that the all-hosts rates, or else the migrate latency, apply
// again.
func (d *Driver) ClearRates(ctx context.Context, host string) error {
	return d.storeRates(ctx, host, "")
}

func (d *Driver) storeRates(ctx context.Context, host, value string) error {
	if host == "" {
		var err error
		if value == "" {
			err = d.rdb.HDel(ctx, d.globalRatesKey(), ratesField).Err()
		} else {
			err = d.rdb.HSet(ctx, d.globalRatesKey(), ratesField, value).Err()
		}
		if err != nil {
			return fmt.Errorf("sim: rates of every host: %w", err)
		}
		return nil
	}
	code, _, err := d.run(ctx, setHostFieldScript, []string{d.topoKey(host), d.ratesKey(host)}, ratesField, value)
	if err != nil {
		return fmt.Errorf("sim: rates of %s: %w", host, err)
	}
	if code == "NOHOST" {
		return fmt.Errorf("sim: rates: %w", unknownHost(host))
	}
	return nil
}

// ratesOf are the rates of migrations from host: its own, else the
// all-hosts ones; nil when neither is set.
func (d *Driver) ratesOf(ctx context.Context, host string) (*Rates, error) {
	pipe := d.rdb.Pipeline()
	onHost := pipe.HGet(ctx, d.ratesKey(host), ratesField)
	global := pipe.HGet(ctx, d.globalRatesKey(), ratesField)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	for _, c := range []*redis.StringCmd{onHost, global} {
		if c.Err() == nil {
			return parseRates(c.Val())
		}
	}
	return nil, nil
}

// parseRates reads stored rates; "" is none.
func parseRates(s string) (*Rates, error) {
	if s == "" {
		return nil, nil
	}
	t, dirty, ok := strings.Cut(s, ",")
	var r Rates
	var err1, err2 error
	r.TransferMiBs, err1 = strconv.ParseFloat(t, 64)
	r.DirtyMiBs, err2 = strconv.ParseFloat(dirty, 64)
	if !ok || err1 != nil || err2 != nil || r.check() != nil {
		return nil, fmt.Errorf("stored migration rates %q: want transfer,dirty in MiB/s, the transfer rate more than 0", s)
	}
	return &r, nil
}

func hostOrAll(host string) string {
	if host == "" {
		return "every host"
	}
	return host
}
