package config_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// readmeExample is the configuration the README shows.
const readmeExample = `
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY
    models:
      - name: gpt-4o-mini
        rpm: 500
        tpm: 200000
        max_concurrency: 50
tenants:
  - name: acme
    api_key_env: ACME_SLUICE_KEY
    weight: 1
`

func TestParseReadmeExample(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(readmeExample))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got, want := len(c.Providers), 1; got != want {
		t.Fatalf("providers: got %d, want %d", got, want)
	}
	p := c.Providers[0]
	for _, tc := range []struct {
		what      string
		got, want any
	}{
		{"providers[0].name", p.Name, "openai"},
		{"providers[0].kind", p.Kind, "openai"},
		{"providers[0].base_url", p.BaseURL, "https://api.openai.com/v1"},
		{"providers[0].api_key_env", p.APIKeyEnv, "OPENAI_API_KEY"},
		{"providers[0].timeout", p.Timeout.D(), 120 * time.Second},
		{"providers[0].models", len(p.Models), 1},
		{"providers[0].models[0]", p.Models[0], config.Model{Name: "gpt-4o-mini", Weight: 1, RPM: 500, TPM: 200000, MaxConcurrency: 50}},
		{"tenants", len(c.Tenants), 1},
		{"tenants[0]", c.Tenants[0], config.Tenant{Name: "acme", APIKeyEnv: "ACME_SLUICE_KEY", Weight: 1}},
		{"limits.max_body_bytes", c.Limits.MaxBodyBytes, job.DefaultLimits.MaxBodyBytes},
		{"limits.max_tokens", c.Limits.MaxTokens, job.DefaultLimits.MaxTokens},
		{"limits.default_max_tokens", c.Limits.DefaultMaxTokens, 1024},
		{"limits.result_retention", c.Limits.ResultRetention.D(), 24 * time.Hour},
		{"limits.dlq_retention", c.Limits.DLQRetention.D(), 24 * time.Hour},
		{"limits.max_wait", c.Limits.MaxWait.D(), 15 * time.Minute},
		{"limits.max_waiters_per_tenant", c.Limits.MaxWaitersPerTenant, 100},
		{"server.open", c.Server.Open, false},
		{"server.http_timeouts", c.Server.HTTPTimeouts, config.HTTPTimeouts{ReadHeader: config.Duration(10 * time.Second),
			Read: config.Duration(time.Minute), Write: config.Duration(time.Minute), Idle: config.Duration(2 * time.Minute)}},
		{"admission.slice", c.Admission.Slice.D(), 250 * time.Millisecond},
		{"admission.dispatch_grace", c.Admission.DispatchGrace.D(), time.Second},
		{"admission.burst_fraction", c.Admission.BurstFraction, 1.0 / 60},
		{"admission.send_lead", c.Admission.SendLead.D(), 20 * time.Millisecond},
		{"admission.send_tolerance", c.Admission.SendTolerance.D(), 15 * time.Millisecond},
		{"admission.plan_horizon", c.Admission.PlanHorizon.D(), 2 * time.Second},
		{"admission.schedule_owner", c.Admission.ScheduleOwner, config.ScheduleOwner{Wait: config.Duration(100 * time.Millisecond)}},
		{"admission.max_rate_limited", c.Admission.MaxRateLimited, 100},
		{"admission.batch", c.Admission.Batch, 256},
		{"admission.tenant_window", c.Admission.TenantWindow, 10_000},
		{"queues.intake", c.Queues.Intake, config.StreamBounds{MaxMsgs: 200_000, MaxBytes: 256 << 20, MaxPerTenant: 20_000}},
		{"queues.queue", c.Queues.Queue, config.StreamBounds{MaxMsgs: 500_000, MaxBytes: 1 << 30, MaxPerTenant: 100_000}},
		{"retry classes", len(c.Retry), 3},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	for _, p := range job.Priorities {
		got, ok := c.Retry[string(p)]
		if !ok {
			t.Errorf("retry.%s: missing, want the default class", p)
			continue
		}
		if want := config.DefaultPolicies[string(p)]; got != want {
			t.Errorf("retry.%s: got %+v, want %+v", p, got, want)
		}
	}
}

func TestParseDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
providers:
  - name: local
    kind: anthropic
    base_url: http://127.0.0.1:8080
    models:
      - name: m1
      - name: m2
        max_concurrency: 3
tenants:
  - name: acme
  - name: beta
    weight: 7
retry:
  batch:
    max_attempts: 2
    max_elapsed: 10s
    base_delay: 100ms
    max_delay: 1s
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	for _, tc := range []struct {
		what      string
		got, want any
	}{
		{"providers[0].kind", c.Providers[0].Kind, "anthropic"},
		{"providers[0].models[0].max_concurrency", c.Providers[0].Models[0].MaxConcurrency, 64},
		{"providers[0].models[0].rpm (0 = no limit)", c.Providers[0].Models[0].RPM, 0},
		{"providers[0].models[1].max_concurrency", c.Providers[0].Models[1].MaxConcurrency, 3},
		{"tenants[0].weight", c.Tenants[0].Weight, 1},
		{"tenants[1].weight", c.Tenants[1].Weight, 7},
		{"retry.batch", c.Retry["batch"], config.Policy{MaxAttempts: 2, MaxElapsed: config.Duration(10 * time.Second), BaseDelay: config.Duration(100 * time.Millisecond), MaxDelay: config.Duration(time.Second)}},
		{"retry.standard", c.Retry["standard"], config.DefaultPolicies["standard"]},
		{"retry.interactive", c.Retry["interactive"], config.DefaultPolicies["interactive"]},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.what, tc.got, tc.want)
		}
	}
}

func TestParseQueues(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
queues:
  intake: {max_msgs: 1000, max_bytes: 16777216, max_per_tenant: 100}
  queue: {max_msgs: 5000}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	for _, tc := range []struct {
		what      string
		got, want any
	}{
		{"queues.intake", c.Queues.Intake, config.StreamBounds{MaxMsgs: 1000, MaxBytes: 16 << 20, MaxPerTenant: 100}},
		// Unset keys take the defaults; max_per_tenant is at most max_msgs.
		{"queues.queue", c.Queues.Queue, config.StreamBounds{MaxMsgs: 5000, MaxBytes: 1 << 30, MaxPerTenant: 5000}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.what, tc.got, tc.want)
		}
	}
}

// TestHeadroom: absent means the default, an explicit 0 turns it off, and
// out-of-range values are refused with the key named.
func TestHeadroom(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml string
		want float64
	}{
		{"", config.DefaultHeadroom},
		{"admission: {headroom: 0}\n", 0},
		{"admission: {headroom: 0.1}\n", 0.1},
	} {
		c, err := config.Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.yaml, err)
		}
		if got := c.Admission.HeadroomShare(); got != tc.want {
			t.Errorf("Parse(%q): headroom %g, want %g", tc.yaml, got, tc.want)
		}
	}
	for _, bad := range []string{"admission: {headroom: 0.5}\n", "admission: {headroom: -0.1}\n"} {
		if _, err := config.Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "admission.headroom: ") {
			t.Errorf("Parse(%q): got %v, want an error naming admission.headroom", bad, err)
		}
	}
}

func TestParseEmpty(t *testing.T) {
	t.Parallel()
	for _, data := range []string{"", "\n", "# nothing\n"} {
		c, err := config.Parse([]byte(data))
		if err != nil {
			t.Fatalf("Parse(%q): %v", data, err)
		}
		if got, want := len(c.Retry), 3; got != want {
			t.Errorf("Parse(%q): retry classes got %d, want %d", data, got, want)
		}
		if got, want := len(c.Providers), 0; got != want {
			t.Errorf("Parse(%q): providers got %d, want %d", data, got, want)
		}
	}
}

// provider is a valid provider block with room for one extra key and models.
func provider(name, models string) string {
	return "  - name: " + name + "\n    base_url: https://api.example.test/v1\n    models:\n" + models
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	const secret = "sk-abc123def456ghi789jkl012mno345"
	model := func(name string) string { return "      - name: " + name + "\n" }
	for _, tc := range []struct {
		name string
		yaml string
		// every string must appear in the error
		want []string
		// none may appear in the error
		notWant []string
	}{
		{
			name: "missing base_url",
			yaml: "providers:\n  - name: openai\n    models:\n      - name: m\n",
			want: []string{"providers[0].base_url: ", "must be an http(s) URL"},
		},
		{
			name: "base_url without scheme",
			yaml: "providers:\n  - name: openai\n    base_url: api.openai.com/v1\n    models:\n      - name: m\n",
			want: []string{"providers[0].base_url: ", `must be an http(s) URL, got "api.openai.com/v1"`},
		},
		{
			name: "base_url of another scheme",
			yaml: "providers:\n" + provider("a", model("m")) + "  - name: b\n    base_url: ftp://files.example.test\n    models:\n      - name: m2\n",
			want: []string{"providers[1].base_url: ", "must be an http(s) URL"},
		},
		{
			name: "negative rpm",
			yaml: "providers:\n" + provider("openai", model("m1")+model("m2")+"        rpm: -1\n"),
			want: []string{"providers[0].models[1].rpm: ", "must be >= 0", "got -1"},
		},
		{
			name: "negative tpm",
			yaml: "providers:\n" + provider("openai", model("m1")+"        tpm: -200\n"),
			want: []string{"providers[0].models[0].tpm: ", "must be >= 0", "got -200"},
		},
		{
			name: "negative unit limit",
			yaml: "providers:\n" + provider("openai", model("m1")+"        units: {images: 5, audio_seconds: -1}\n"),
			want: []string{"providers[0].models[0].units.audio_seconds: ", "got -1"},
		},
		{
			name: "bad unit name",
			yaml: "providers:\n" + provider("openai", model("m1")+"        units: {Images: 5}\n"),
			want: []string{"providers[0].models[0].units: ", `"Images"`, "a-z, 0-9 and '_'"},
		},
		{
			name: "unit named like a built-in dimension",
			yaml: "providers:\n" + provider("openai", model("m1")+"        units: {tokens: 5}\n"),
			want: []string{"providers[0].models[0].units: ", `"tokens"`},
		},
		{
			name: "too many units",
			yaml: "providers:\n" + provider("openai", model("m1")+"        units: {a: 1, b: 1, c: 1, d: 1, e: 1}\n"),
			want: []string{"providers[0].models[0].units: ", "names 5 units; at most 4"},
		},
		{
			name: "negative max_concurrency",
			yaml: "providers:\n" + provider("openai", model("m1")+"        max_concurrency: -2\n"),
			want: []string{"providers[0].models[0].max_concurrency: ", "got -2"},
		},
		{
			name: "duplicate provider names",
			yaml: "providers:\n" + provider("openai", model("m1")) + provider("openai", model("m2")),
			want: []string{"providers[1].name: ", `"openai" appears twice`},
		},
		{
			name: "same model twice under one provider",
			yaml: "providers:\n" + provider("openai", model("gpt-4o-mini")+model("gpt-4o-mini")),
			want: []string{"providers[0].models[1].name: ", `"gpt-4o-mini" appears twice under provider "openai"`},
		},
		{
			name: "tier out of range",
			yaml: "providers:\n" + provider("a", model("m")+"        tier: 10\n"),
			want: []string{"providers[0].models[0].tier: ", "between 0 and 9, got 10"},
		},
		{
			name: "negative tier",
			yaml: "providers:\n" + provider("a", model("m")+"        tier: -1\n"),
			want: []string{"providers[0].models[0].tier: ", "got -1"},
		},
		{
			name: "weight out of range",
			yaml: "providers:\n" + provider("a", model("m")+"        weight: 1001\n"),
			want: []string{"providers[0].models[0].weight: ", "between 1 and 1000, got 1001"},
		},
		{
			name: "upstream with a space",
			yaml: "providers:\n" + provider("a", model("m")+"        upstream: \"gpt 4o\"\n"),
			want: []string{"providers[0].models[0].upstream: ", "without spaces"},
		},
		{
			name: "group mixing anthropic and openai",
			yaml: "providers:\n" + provider("a", model("m")) + "  - name: b\n    kind: anthropic\n    base_url: https://api.example.test\n    models:\n      - {name: m, itpm: 10, otpm: 10}\n",
			want: []string{"providers[1].models[0].name: ", `also served by provider "a" of kind openai`},
		},
		{
			name: "group with other units",
			yaml: "providers:\n" + provider("a", model("m")+"        units: {images: 5}\n") + provider("b", model("m")),
			want: []string{"providers[1].models[0].units: ", "names other units"},
		},
		{
			name: "group with other denied fields",
			yaml: "providers:\n" + provider("a", model("m")) + provider("b", model("m")+"        deny_fields: [seed]\n"),
			want: []string{"providers[1].models[0].allow_fields: ", "lets other fields through"},
		},
		{
			name: "affinity ttl too short",
			yaml: "admission:\n  cache_affinity: {ttl: 10ms}\n",
			want: []string{"admission.cache_affinity.ttl: ", "between 1s and 24h"},
		},
		{
			name: "affinity max_delay negative",
			yaml: "admission:\n  cache_affinity: {max_delay: -1s}\n",
			want: []string{"admission.cache_affinity.max_delay: ", "between 0 and 1m"},
		},
		{
			name: "colliding subject tokens",
			yaml: "providers:\n" + provider("openai", model(`"gpt-4.1"`)+model("gpt-4_1")),
			want: []string{"providers[0].models[1].name: ", `"gpt-4_1" and "gpt-4.1" map to the same subject token "gpt-4_1"`},
		},
		{
			name: "model without name",
			yaml: "providers:\n" + provider("openai", "      - rpm: 5\n"),
			want: []string{"providers[0].models[0].name: ", "is required"},
		},
		{
			name: "provider without models",
			yaml: "providers:\n  - name: openai\n    base_url: https://api.example.test\n",
			want: []string{"providers[0].models: ", "at least one model"},
		},
		{
			name: "provider name with a dot",
			yaml: "providers:\n" + provider("open.ai", model("m")),
			want: []string{"providers[0].name: ", `"open.ai" must be 1-64 letters`},
		},
		{
			name: "unknown provider kind",
			yaml: "providers:\n  - name: openai\n    kind: bedrock\n    base_url: https://api.example.test\n    models:\n      - name: m\n",
			want: []string{"providers[0].kind: ", `must be openai, anthropic or azure, got "bedrock"`},
		},
		{
			name: "api_version on an openai provider",
			yaml: "providers:\n  - name: openai\n    api_version: 2024-10-21\n    base_url: https://api.example.test\n    models:\n      - name: m\n",
			want: []string{"providers[0].api_version: ", "is an azure provider's"},
		},
		{
			name: "azure api_version with a slash",
			yaml: "providers:\n  - name: az\n    kind: azure\n    api_version: a/b\n    base_url: https://r.openai.azure.test\n    models:\n      - name: m\n",
			want: []string{"providers[0].api_version: ", "must be a version"},
		},
		{
			name: "negative provider timeout",
			yaml: "providers:\n  - name: openai\n    timeout: -5s\n    base_url: https://api.example.test\n    models:\n      - name: m\n",
			want: []string{"providers[0].timeout: ", "must be positive, got -5s"},
		},
		{
			name:    "provider api_key_env holding a key",
			yaml:    "providers:\n  - name: openai\n    api_key_env: " + secret + "\n    base_url: https://api.example.test\n    models:\n      - name: m\n",
			want:    []string{"providers[0].api_key_env: ", "must name an environment variable"},
			notWant: []string{secret, secret[:12]},
		},
		{
			name:    "provider api_key_env holding a short key",
			yaml:    "providers:\n  - name: openai\n    api_key_env: sk-abc123...\n    base_url: https://api.example.test\n    models:\n      - name: m\n",
			want:    []string{"providers[0].api_key_env: ", "must name an environment variable"},
			notWant: []string{"sk-abc123...", "abc123"},
		},
		{
			name:    "tenant api_key_env holding a key",
			yaml:    "tenants:\n  - name: acme\n    api_key_env: " + secret + "\n",
			want:    []string{"tenants[0].api_key_env: ", "must name an environment variable"},
			notWant: []string{secret, secret[:12]},
		},
		{
			name: "api_key_env starting with a digit",
			yaml: "tenants:\n  - name: acme\n    api_key_env: 1KEY\n",
			want: []string{"tenants[0].api_key_env: ", "must name an environment variable"},
		},
		{
			name: "tenant name with a dot",
			yaml: "tenants:\n  - name: acme.eu\n",
			want: []string{"tenants[0].name: ", `"acme.eu" must be 1-64 letters, digits, '-' or '_'`},
		},
		{
			name: "tenant without a name",
			yaml: "tenants:\n  - weight: 2\n",
			want: []string{"tenants[0].name: ", `"" must be 1-64`},
		},
		{
			name: "duplicate tenants",
			yaml: "tenants:\n  - name: acme\n  - name: beta\n  - name: acme\n",
			want: []string{"tenants[2].name: ", `"acme" appears twice`},
		},
		{
			name: "negative tenant weight",
			yaml: "tenants:\n  - name: acme\n    weight: -1\n",
			want: []string{"tenants[0].weight: ", "must be between 1 and 1000, got -1"},
		},
		{
			name: "tenant weight too large",
			yaml: "tenants:\n  - name: acme\n  - name: beta\n    weight: 5000\n",
			want: []string{"tenants[1].weight: ", "must be between 1 and 1000, got 5000"},
		},
		{
			name: "unknown top-level key",
			yaml: "provders:\n" + provider("openai", model("m")),
			want: []string{"provders: unknown key; did you mean providers? (line 1)"},
		},
		{
			name: "unknown nested key",
			yaml: "providers:\n  - name: openai\n    base_url: https://api.example.test\n    modles:\n      - name: m\n",
			want: []string{"providers[0].modles: unknown key; did you mean models? (line 4)"},
		},
		{
			name: "unknown retry class",
			yaml: "retry:\n  urgent:\n    max_attempts: 2\n    max_elapsed: 5s\n    base_delay: 1s\n    max_delay: 2s\n",
			want: []string{"retry.urgent: ", "unknown policy class"},
		},
		{
			name: "retry max_attempts out of range",
			yaml: "retry:\n  batch:\n    max_attempts: 0\n    max_elapsed: 5m\n    base_delay: 1s\n    max_delay: 10s\n",
			want: []string{"retry.batch.max_attempts: ", "must be between 1 and 100, got 0"},
		},
		{
			name: "retry without max_elapsed",
			yaml: "retry:\n  interactive:\n    max_attempts: 2\n    base_delay: 1s\n    max_delay: 10s\n",
			want: []string{"retry.interactive.max_elapsed: ", "must be positive"},
		},
		{
			name: "retry base_delay above max_delay",
			yaml: "retry:\n  standard:\n    max_attempts: 2\n    max_elapsed: 1m\n    base_delay: 20s\n    max_delay: 10s\n",
			want: []string{"retry.standard.base_delay: ", "at most max_delay"},
		},
		{
			name: "admission.slice too short",
			yaml: "admission:\n  slice: 5ms\n",
			want: []string{"admission.slice: ", "must be between 10ms and 5s, got 5ms"},
		},
		{
			name: "admission.slice too long",
			yaml: "admission:\n  slice: 10s\n",
			want: []string{"admission.slice: ", "got 10s"},
		},
		{
			name: "admission.dispatch_grace too long",
			yaml: "admission:\n  dispatch_grace: 1m\n",
			want: []string{"admission.dispatch_grace: ", "must be between 0 and 30s, got 1m0s"},
		},
		{
			name: "admission.burst_fraction above 1",
			yaml: "admission:\n  burst_fraction: 1.5\n",
			want: []string{"admission.burst_fraction: ", "must be in (0, 1], got 1.5"},
		},
		{
			name: "admission.schedule_owner.wait too long",
			yaml: "admission:\n  schedule_owner: {enabled: true, wait: 10s}\n",
			want: []string{"admission.schedule_owner.wait: ", "must be between 1ms and 5s, got 10s"},
		},
		{
			name: "admission.burst_fraction negative",
			yaml: "admission:\n  burst_fraction: -0.1\n",
			want: []string{"admission.burst_fraction: ", "got -0.1"},
		},
		{
			name: "admission.batch negative",
			yaml: "admission:\n  batch: -1\n",
			want: []string{"admission.batch: ", "must be positive, got -1"},
		},
		{
			name: "admission.tenant_window negative",
			yaml: "admission:\n  tenant_window: -1\n",
			want: []string{"admission.tenant_window: ", "between 1 and queues.queue.max_msgs (500000), got -1"},
		},
		{
			name: "admission.tenant_window above QUEUE",
			yaml: "queues:\n  queue: {max_msgs: 100, max_per_tenant: 100}\nadmission:\n  tenant_window: 101\n",
			want: []string{"admission.tenant_window: ", "between 1 and queues.queue.max_msgs (100), got 101"},
		},
		{
			name: "queues.intake.max_msgs negative",
			yaml: "queues:\n  intake: {max_msgs: -1}\n",
			want: []string{"queues.intake.max_msgs: ", "must be positive", "got -1"},
		},
		{
			name: "queues.queue.max_bytes below one message",
			yaml: "queues:\n  queue: {max_bytes: 1000}\n",
			want: []string{"queues.queue.max_bytes: ", "must be at least 1048576", "got 1000"},
		},
		{
			name: "queues.queue.max_per_tenant above max_msgs",
			yaml: "queues:\n  queue: {max_msgs: 100, max_per_tenant: 200}\n",
			want: []string{"queues.queue.max_per_tenant: ", "between 1 and max_msgs (100), got 200"},
		},
		{
			name: "queues unknown key",
			yaml: "queues:\n  queue: {max_mesages: 100}\n",
			want: []string{"queues.queue.max_mesages: unknown key; did you mean max_msgs? (line 2)"},
		},
		{
			name: "duration in words",
			yaml: "admission:\n  slice: 5 minutes\n",
			want: []string{"admission.slice: ", `"5 minutes" is not a duration`},
		},
		{
			name: "duration without unit",
			yaml: "limits:\n  result_retention: 3600\n",
			want: []string{"limits.result_retention: ", `"3600" is not a duration`},
		},
		{
			name: "duration in a provider",
			yaml: "providers:\n" + provider("a", model("m")) + "  - name: b\n    base_url: https://b.example.test\n    timeout: two minutes\n    models:\n      - name: m2\n",
			want: []string{"providers[1].timeout: ", `"two minutes" is not a duration`},
		},
		{
			name: "duration in a retry class",
			yaml: "retry:\n  batch:\n    max_attempts: 3\n    max_elapsed: forever\n",
			want: []string{"retry.batch.max_elapsed: ", `"forever" is not a duration`},
		},
		{
			name: "negative result_retention",
			yaml: "limits:\n  result_retention: -1h\n",
			want: []string{"limits.result_retention: ", "must be positive, got -1h0m0s"},
		},
		{
			name: "negative dlq_retention",
			yaml: "limits:\n  dlq_retention: -1h\n",
			want: []string{"limits.dlq_retention: ", "must be positive"},
		},
		{
			name: "max_wait too long",
			yaml: "limits:\n  max_wait: 1000h\n",
			want: []string{"limits.max_wait: ", "between 1s and 24h"},
		},
		{
			name: "negative max_waiters_per_tenant",
			yaml: "limits:\n  max_waiters_per_tenant: -1\n",
			want: []string{"limits.max_waiters_per_tenant: ", "must be positive"},
		},
		{
			name: "negative http timeout",
			yaml: "server:\n  http_timeouts: {idle: -1s}\n",
			want: []string{"server.http_timeouts.idle: ", "must be positive"},
		},
		{
			name: "http_tls without a key",
			yaml: "server:\n  http_tls: {cert: cert.pem}\n",
			want: []string{"server.http_tls: ", "needs both cert and key"},
		},
		{
			name: "max_body_bytes too small",
			yaml: "limits:\n  max_body_bytes: 100\n",
			want: []string{"limits.max_body_bytes: ", "at least 1024, got 100"},
		},
		{
			name: "default_max_tokens above max_tokens",
			yaml: "limits:\n  max_tokens: 500\n  default_max_tokens: 600\n",
			want: []string{"limits.default_max_tokens: ", "is 600, above limits.max_tokens 500"},
		},
		{
			name: "negative default_max_tokens",
			yaml: "limits:\n  default_max_tokens: -1\n",
			want: []string{"limits.default_max_tokens: ", "must be positive, got -1"},
		},
		{
			name: "negative max_tokens",
			yaml: "limits:\n  max_tokens: -5\n",
			want: []string{"limits.max_tokens: ", "must be positive, got -5"},
		},
		{
			name: "wrong type",
			yaml: "providers:\n  - name: openai\n    base_url: https://api.example.test\n    models:\n      - name: m\n        rpm: lots\n",
			want: []string{`providers[0].models[0].rpm: must be a whole number, got "lots" (line 6)`},
		},
		{
			name: "not a mapping",
			yaml: "- providers\n",
			want: []string{"config: ", "must be a mapping of keys (server, "},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := config.Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse: got a config %+v, want an error containing %q", c, tc.want)
			}
			if c != nil {
				t.Errorf("Parse: got a config with the error %v, want nil", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config: ") {
				t.Errorf("error: got %q, want it to start with %q", msg, "config: ")
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error: got %q, want it to contain %q", msg, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(msg, w) {
					t.Errorf("error: got %q, want it not to contain %q", msg, w)
				}
			}
		})
	}
}

// With several problems, Validate must report the same one every time (it
// used to depend on map iteration order for retry classes).
func TestParseErrorIsDeterministic(t *testing.T) {
	t.Parallel()
	data := []byte("retry:\n  urgent: {}\n  asap: {}\n  someday: {}\n")
	first := ""
	for i := range 40 {
		_, err := config.Parse(data)
		if err == nil {
			t.Fatal("Parse: got nil error, want one")
		}
		if i == 0 {
			first = err.Error()
			if !strings.Contains(first, "retry.asap: ") {
				t.Errorf("error: got %q, want the first class in order, retry.asap", first)
			}
			continue
		}
		if got := err.Error(); got != first {
			t.Fatalf("run %d: got %q, want %q as in run 0", i, got, first)
		}
	}
}

func TestValidateAfterEdit(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(readmeExample))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	c.Providers[0].Models[0].RPM = -3
	err = c.Validate()
	if err == nil || !strings.Contains(err.Error(), "providers[0].models[0].rpm") {
		t.Errorf("Validate: got %v, want an error naming providers[0].models[0].rpm", err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	good := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(good, []byte(readmeExample), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(good)
	if err != nil {
		t.Fatalf("Load(%s): %v", good, err)
	}
	if got, want := c.Providers[0].Name, "openai"; got != want {
		t.Errorf("providers[0].name: got %q, want %q", got, want)
	}

	missing := filepath.Join(dir, "nope.yaml")
	_, err = config.Load(missing)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file: got %v, want an error wrapping fs.ErrNotExist", err)
	}
	if err != nil && !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("Load of a missing file: got %q, want it to name the file", err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("tenants:\n  - name: a.b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = config.Load(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": config: tenants[0].name: ") {
		t.Errorf("Load of a bad file: got %v, want it to start with %q", err, bad+": config: tenants[0].name: ")
	}

	c, err = config.Load("")
	if err != nil {
		t.Fatalf(`Load(""): %v`, err)
	}
	if got, want := len(c.Providers), 0; got != want {
		t.Errorf(`Load(""): providers got %d, want %d`, got, want)
	}
}

func TestTenantKeys(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
tenants:
  - name: acme
    api_key_env: ACME_KEY
  - name: beta
    api_key_env: BETA_KEY
  - name: delta
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	env := map[string]string{
		"ACME_KEY": "key-acme",
		"BETA_KEY": "  key-beta\n",
		"":         "must-not-be-read",
	}
	var asked []string
	got, err := c.TenantKeys(func(k string) string {
		asked = append(asked, k)
		return env[k]
	})
	if err != nil {
		t.Fatalf("TenantKeys: %v", err)
	}
	want := map[string]string{"key-acme": "acme", "key-beta": "beta"}
	if len(got) != len(want) {
		t.Errorf("TenantKeys: got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("TenantKeys[%q]: got %q, want %q", k, got[k], v)
		}
	}
	for _, k := range asked {
		if k == "" {
			t.Errorf("TenantKeys: got a lookup of the empty name, want none for a tenant without api_key_env")
		}
	}
	if got, err := (&config.Config{}).TenantKeys(func(string) string { return "x" }); err != nil || len(got) != 0 {
		t.Errorf("TenantKeys with no tenants: got %v, %v; want empty, nil", got, err)
	}
}

// A key variable that is unset or blank, and a key two tenants share, are
// errors that name the variable and the tenant, and never show the key.
func TestTenantKeysRefused(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: gamma, api_key_env: GAMMA_KEY}
  - {name: eps, api_key_env: EPS_KEY}
  - {name: zeta, api_key_env: ZETA_KEY}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	const secret = "s3cret-shared-key"
	env := map[string]string{"ACME_KEY": secret, "EPS_KEY": "  \t", "ZETA_KEY": " " + secret + " "}
	_, err = c.TenantKeys(func(k string) string { return env[k] })
	if err == nil {
		t.Fatal("TenantKeys with an unset, a blank and a duplicate key: got nil, want an error")
	}
	msg := err.Error()
	for _, want := range []string{"GAMMA_KEY", "gamma", "EPS_KEY", "eps", "ZETA_KEY", "zeta", `"acme"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("TenantKeys error %q: does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, secret) {
		t.Errorf("TenantKeys error %q shows the key", msg)
	}
}

func TestLookups(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(readmeExample + `
  - name: beta
    weight: 3
retry:
  batch:
    max_attempts: 9
    max_elapsed: 10m
    base_delay: 2s
    max_delay: 1m
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}

	p, m, ok := c.ModelRef("gpt-4o-mini")
	if !ok || p.Name != "openai" || m.Name != "gpt-4o-mini" || m.RPM != 500 {
		t.Errorf("ModelRef(gpt-4o-mini): got %v, %v, %v, want openai, gpt-4o-mini with rpm 500, true", p, m, ok)
	}
	if p, m, ok := c.ModelRef("gpt-4o"); ok || p != nil || m != nil {
		t.Errorf("ModelRef(gpt-4o): got %v, %v, %v, want nil, nil, false", p, m, ok)
	}

	tn, ok := c.Tenant("beta")
	if !ok || tn.Weight != 3 {
		t.Errorf("Tenant(beta): got %v, %v, want weight 3, true", tn, ok)
	}
	if tn, ok := c.Tenant("Beta"); ok || tn != nil {
		t.Errorf("Tenant(Beta): got %v, %v, want nil, false (names are case sensitive)", tn, ok)
	}

	if got, want := c.Policy(job.Batch).MaxAttempts, 9; got != want {
		t.Errorf("Policy(batch).MaxAttempts: got %d, want %d", got, want)
	}
	if got, want := c.Policy(job.Interactive), config.DefaultPolicies["interactive"]; got != want {
		t.Errorf("Policy(interactive): got %+v, want %+v", got, want)
	}
	if got, want := c.Policy("urgent"), config.DefaultPolicies["standard"]; got != want {
		t.Errorf("Policy(urgent): got %+v, want the standard default %+v", got, want)
	}
	if got, want := (&config.Config{}).Policy(job.Batch), config.DefaultPolicies["standard"]; got != want {
		t.Errorf("Policy on an empty config: got %+v, want %+v", got, want)
	}
}

func TestDurationYAML(t *testing.T) {
	t.Parallel()
	d := config.Duration(1500 * time.Millisecond)
	v, err := d.MarshalYAML()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v, any("1.5s"); got != want {
		t.Errorf("MarshalYAML: got %v, want %v", got, want)
	}
	if got, want := d.D(), 1500*time.Millisecond; got != want {
		t.Errorf("D(): got %v, want %v", got, want)
	}
}

// Dead letters hold requests: unless set, they are kept as long as results.
func TestDLQRetentionFollowsResults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"limits: {result_retention: 2h}\n", 2 * time.Hour},
		{"limits: {result_retention: 2h, dlq_retention: 168h}\n", 168 * time.Hour},
	} {
		c, err := config.Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.yaml, err)
		}
		if got := c.Limits.DLQRetention.D(); got != tc.want {
			t.Errorf("Parse(%q): dlq_retention got %v, want %v", tc.yaml, got, tc.want)
		}
	}
}

func TestParseUnits(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models:
      - {name: img, rpm: 1000, units: {tasks: 0, images: 50, audio_seconds: 600}}
      - {name: plain, rpm: 10}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	m := c.Providers[0].Models[0]
	if got, want := m.UnitNames(), []string{"audio_seconds", "images", "tasks"}; !reflect.DeepEqual(got, want) {
		t.Errorf("unit names: got %v, want %v (sorted: the budgets' indices)", got, want)
	}
	if got, want := m.UnitLimits(), [4]int{600, 50, 0, 0}; got != want {
		t.Errorf("unit limits: got %v, want %v", got, want)
	}
	if got := c.Providers[0].Models[1].UnitNames(); len(got) != 0 {
		t.Errorf("a model without units: got %v", got)
	}
}

// A model's schedule has an owner unless the config turns it off.
func TestScheduleOwnerOnByDefault(t *testing.T) {
	for yaml, want := range map[string]bool{"": true, "admission:\n  schedule_owner: {enabled: true}\n": true,
		"admission:\n  schedule_owner: {enabled: false}\n": false} {
		c, err := config.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Admission.ScheduleOwner.On(); got != want {
			t.Errorf("%q: schedule owner on %v, want %v", yaml, got, want)
		}
	}
}
