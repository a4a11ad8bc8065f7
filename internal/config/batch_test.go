package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
)

func TestBatchLaneConfig(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`providers:
  - name: p
    base_url: "http://127.0.0.1:1/v1"
    models:
      - {name: m, batch: {enabled: true, enqueued_tokens: 90000}}
      - {name: off, batch: {enabled: false, collect: 5s}}
      - {name: none}
`))
	if err != nil {
		t.Fatal(err)
	}
	l, ok := c.Providers[0].Models[0].Lane()
	if !ok || l.Collect.D() != 30*time.Second || l.MinDeadline.D() != time.Hour || l.Rescue.D() != 10*time.Minute ||
		l.Poll.D() != 30*time.Second || l.MaxLines != config.DefaultBatchMaxLines || l.EnqueuedTokens != 90000 {
		t.Errorf("lane %+v (on %v), want the defaults and enqueued_tokens 90000", l, ok)
	}
	for i := 1; i < 3; i++ {
		if _, ok := c.Providers[0].Models[i].Lane(); ok {
			t.Errorf("model %d: lane on, want off", i)
		}
	}
	for bad, key := range map[string]string{
		`{enabled: true, collect: 2h}`:                    "batch.collect",
		`{enabled: true, rescue: -1s}`:                    "batch.rescue",
		`{enabled: true, min_deadline: 10m, rescue: 10m}`: "batch.rescue",
		`{enabled: true, poll: 1h}`:                       "batch.poll",
		`{enabled: true, max_lines: 50001}`:               "batch.max_lines",
		`{enabled: true, enqueued_tokens: -5}`:            "batch.enqueued_tokens",
		`{enabled: true, queue_requests: -1}`:             "batch.queue_requests",
		`{enabled: true, collect: soon}`:                  "batch.collect",
	} {
		_, err := config.Parse([]byte(`providers:
  - name: p
    base_url: "http://127.0.0.1:1/v1"
    models: [{name: m, batch: ` + bad + `}]
`))
		if err == nil || !strings.Contains(err.Error(), "providers[0].models[0]."+key) {
			t.Errorf("%s: error %v, want one naming %s", bad, err, key)
		}
	}
}
