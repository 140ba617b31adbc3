package workflows

import (
	"maps"
	"sync"
	"time"

	"go.temporal.io/sdk/client"
)

// capturedMetrics holds every value a workflow recorded, by metric name.
type capturedMetrics struct {
	mu     sync.Mutex
	values map[string][]capturedValue
}

type capturedValue struct {
	tags  map[string]string
	value float64
}

func (c *capturedMetrics) add(name string, tags map[string]string, v float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil {
		c.values = map[string][]capturedValue{}
	}
	c.values[name] = append(c.values[name], capturedValue{tags: tags, value: v})
}

// of returns the values recorded under name.
func (c *capturedMetrics) of(name string) []capturedValue {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]capturedValue(nil), c.values[name]...)
}

// metricsCapture is a Temporal metrics handler recording into to.
type metricsCapture struct {
	to   *capturedMetrics
	tags map[string]string
}

func (m metricsCapture) WithTags(tags map[string]string) client.MetricsHandler {
	all := maps.Clone(m.tags)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, tags)
	return metricsCapture{to: m.to, tags: all}
}

func (m metricsCapture) Counter(name string) client.MetricsCounter { return captured{m, name} }
func (m metricsCapture) Gauge(name string) client.MetricsGauge     { return captured{m, name} }
func (m metricsCapture) Timer(name string) client.MetricsTimer     { return captured{m, name} }

type captured struct {
	m    metricsCapture
	name string
}

func (c captured) Inc(n int64)            { c.m.to.add(c.name, c.m.tags, float64(n)) }
func (c captured) Update(v float64)       { c.m.to.add(c.name, c.m.tags, v) }
func (c captured) Record(d time.Duration) { c.m.to.add(c.name, c.m.tags, d.Seconds()) }
