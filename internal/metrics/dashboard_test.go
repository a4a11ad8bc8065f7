package metrics_test

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/metrics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	dashboardPath  = "../../deploy/grafana/sluice.json"
	prometheusPath = "../../deploy/prometheus/prometheus.yml"
)

// planned are metric names the dashboard may use before metrics.New
// registers them, each with what will add it. Remove a name once it is
// registered. (sluice_model_limit{provider,model,limit}, added by the
// executor/admission wiring, was planned here and is registered now.)
var planned = map[string]string{}

// recorder is a Registerer that keeps what is registered with it.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// registeredElsewhere returns the names of the metrics that packages other
// than this one register on the node's registry (the response cache's):
// counters and gauges, named as they are scraped.
func registeredElsewhere(t *testing.T) map[string]bool {
	t.Helper()
	var r recorder
	cache.New(nil, &r, nil)
	names := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no fqName in %s", d)
			}
			names[m[1]] = true
		}
	}
	if len(names) == 0 {
		t.Fatal("the cache registered no metrics")
	}
	return names
}

// natsExporter are the prefixes of prometheus-nats-exporter's metrics,
// each with the flag that makes it export them (compose.yaml runs it).
var natsExporter = map[string]string{"gnatsd_varz_": "-varz", "jetstream_": "-jsz"}

// exported returns every series name metrics.New makes, as Prometheus would
// scrape them: counters and gauges by name, histograms as _bucket, _sum and
// _count.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	set := metrics.New(reg)

	// A vector shows up in Gather only once it has a child: make one of each,
	// with as many label values as it takes.
	v := reflect.ValueOf(set).Elem()
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		var with func(lvs ...string) error
		switch c := v.Field(i).Interface().(type) {
		case *prometheus.CounterVec:
			with = func(lvs ...string) error { _, err := c.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.GaugeVec:
			with = func(lvs ...string) error { _, err := c.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.HistogramVec:
			with = func(lvs ...string) error { _, err := c.GetMetricWithLabelValues(lvs...); return err }
		case prometheus.Counter, prometheus.Gauge, prometheus.Histogram:
			continue // gathered as they are
		default:
			t.Fatalf("metrics.Set.%s: type %T is not handled by this test; add it", name, c)
		}
		ok := false
		for n := 0; n <= 16 && !ok; n++ {
			ok = with(slices.Repeat([]string{"x"}, n)...) == nil
		}
		if !ok {
			t.Fatalf("metrics.Set.%s: no label count from 0 to 16 fits", name)
		}
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[n], names[n+"_sum"], names[n+"_count"] = true, true, true
		default:
			names[n] = true
		}
	}
	if len(mfs) != v.NumField() {
		t.Fatalf("gathered %d metric families from %d metrics.Set fields", len(mfs), v.NumField())
	}
	return names
}

type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Title      string      `json:"title"`
	Type       string      `json:"type"`
	Datasource *datasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Datasource *datasource `json:"datasource"`
		Expr       string      `json:"expr"`
		RefID      string      `json:"refId"`
	} `json:"targets"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

const dsVar = "${DS_PROMETHEUS}"

func TestDashboardStructure(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.Title == "" {
		t.Error("dashboard has no title")
	}
	if got, want := d.UID, "sluice-overview"; got != want {
		t.Errorf("uid = %q, want %q", got, want)
	}
	if got, want := d.SchemaVersion, 39; got != want {
		t.Errorf("schemaVersion = %d, want %d", got, want)
	}
	var hasDS bool
	for _, v := range d.Templating.List {
		if v.Name == "DS_PROMETHEUS" {
			hasDS = v.Type == "datasource" && v.Query == "prometheus"
		}
	}
	if !hasDS {
		t.Errorf("templating has no DS_PROMETHEUS variable of type datasource, query prometheus: %+v", d.Templating.List)
	}
	if len(d.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}

	ids := map[int]string{}
	for i, p := range d.Panels {
		where := fmt.Sprintf("panel %d (%q)", i, p.Title)
		if p.ID <= 0 {
			t.Errorf("%s: id %d, want a positive id", where, p.ID)
		} else if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id %d is also %q's", where, p.ID, other)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("%s: no title", where)
		}
		if p.Type == "" {
			t.Errorf("%s: no type", where)
		}
		if p.Datasource == nil || p.Datasource.UID != dsVar || p.Datasource.Type != "prometheus" {
			t.Errorf("%s: datasource %+v, want prometheus %s", where, p.Datasource, dsVar)
		}
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v, want w and h positive within 24 columns", where, g)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		refs := map[string]bool{}
		for j, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s target %d: no expr", where, j)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s target %d: refId %q missing or repeated", where, j, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && tg.Datasource.UID != dsVar {
				t.Errorf("%s target %d: datasource %+v, want %s", where, j, tg.Datasource, dsVar)
			}
		}
	}
}

var (
	stringLit  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames returns the names in a PromQL expression that look like
// Sluice's metrics (llm_*, sluice_*) or the NATS exporter's, leaving out
// label values.
func metricNames(expr string) []string {
	var out []string
	for _, id := range identifier.FindAllString(stringLit.ReplaceAllString(expr, `""`), -1) {
		if strings.HasPrefix(id, "llm_") || strings.HasPrefix(id, "sluice_") || natsPrefix(id) != "" {
			out = append(out, id)
		}
	}
	return out
}

func natsPrefix(name string) string {
	for p := range natsExporter {
		if strings.HasPrefix(name, p) {
			return p
		}
	}
	return ""
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (le) (rate(llm_queue_wait_seconds_bucket[5m]))`, []string{"llm_queue_wait_seconds_bucket"}},
		{`rate(sluice_results_total{status="sluice_not_a_metric"}[$__rate_interval]) / llm_x`, []string{"sluice_results_total", "llm_x"}},
		{`max by (provider) (sluice_model_limit{limit="tpm"}) * 60`, []string{"sluice_model_limit"}},
		{`max by (server_id) (gnatsd_varz_connections) + jetstream_stream_total_messages{stream_name="llm_x"}`, []string{"gnatsd_varz_connections", "jetstream_stream_total_messages"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// Every metric a panel queries exists: registered by metrics.New or the
// cache, planned (with what will add it), or, for NATS, exported by
// prometheus-nats-exporter with a flag compose.yaml gives it and listed in
// docs/METRICS.md. A panel on a made-up or renamed metric fails here.
func TestDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	known := exported(t)
	for n := range registeredElsewhere(t) {
		known[n] = true
	}
	for name := range planned {
		if known[name] {
			t.Logf("%s is exported now: remove it from planned", name)
		}
	}
	doc, err := os.ReadFile("../../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	compose, err := os.ReadFile("../../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, p := range loadDashboard(t).Panels {
		for _, tg := range p.Targets {
			names := metricNames(tg.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q target %s: no llm_, sluice_ or NATS exporter metric in %q", p.Title, tg.RefID, tg.Expr)
			}
			for _, n := range names {
				used[n] = true
				if pre := natsPrefix(n); pre != "" {
					if !strings.Contains(string(doc), "`"+n+"`") {
						t.Errorf("panel %q target %s: NATS metric %s is not listed in docs/METRICS.md", p.Title, tg.RefID, n)
					}
					if !strings.Contains(string(compose), natsExporter[pre]) {
						t.Errorf("panel %q target %s: %s needs prometheus-nats-exporter's %s, which compose.yaml does not pass", p.Title, tg.RefID, n, natsExporter[pre])
					}
					continue
				}
				if !known[n] && planned[n] == "" {
					t.Errorf("panel %q target %s: metric %s is not registered by metrics.New or the cache (nor planned)", p.Title, tg.RefID, n)
				}
			}
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("dashboard uses %d metrics: %s", len(names), strings.Join(names, " "))
}

func TestPrometheusConfig(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(prometheusPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Global struct {
			ScrapeInterval string `yaml:"scrape_interval"`
		} `yaml:"global"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
				Port  int      `yaml:"port"`
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", prometheusPath, err)
	}
	var found bool
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != "sluice" {
			continue
		}
		found = true
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job sluice: metrics_path %q, want /metrics", sc.MetricsPath)
		}
		var targets []string
		for _, s := range sc.StaticConfigs {
			targets = append(targets, s.Targets...)
		}
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				targets = append(targets, fmt.Sprintf("%s:%d", n, d.Port))
			}
		}
		if len(targets) == 0 {
			t.Error("job sluice has no targets")
		}
		for _, tg := range targets {
			if !strings.HasSuffix(tg, ":9464") {
				t.Errorf("job sluice: target %q, want the SLUICE_METRICS port 9464 (compose.yaml)", tg)
			}
		}
	}
	if !found {
		t.Errorf("%s has no scrape config with job_name sluice", prometheusPath)
	}
}

func TestGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path, want string
	}{
		{"../../deploy/grafana/provisioning/datasources/prometheus.yaml", "http://prometheus:9090"},
		{"../../deploy/grafana/provisioning/dashboards/sluice.yaml", "/var/lib/grafana/dashboards"},
	} {
		data, err := os.ReadFile(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Errorf("%s: %v", tc.path, err)
			continue
		}
		if doc["apiVersion"] != 1 {
			t.Errorf("%s: apiVersion %v, want 1", tc.path, doc["apiVersion"])
		}
		if !strings.Contains(string(data), tc.want) {
			t.Errorf("%s does not name %s", tc.path, tc.want)
		}
	}
}
