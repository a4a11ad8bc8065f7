package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

type bench struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	ms   *metrics.Set
	svc  *admission.Service
	cfg  *config.Config
	mesh *mesh.Mesh
}

// tenantUnlimited and tenantLimited configure tenant t without and with
// per-minute and per-day budgets of its own (generous: they never bind, but
// admission must keep them).
const (
	tenantUnlimited = "{name: t}"
	tenantLimited   = "{name: t, rpm: 100000000, tpm: 2000000000, rpd: 1000000000, tpd: 2000000000}"
)

func setupBench(b *testing.B, tenant string) *bench {
	b.Helper()
	// Budget to spare: the limits never bind.
	return setupBenchCfg(b, `
admission: {burst_fraction: 1}
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 100000000, tpm: 2000000000}]
tenants: [`+tenant+`]
`)
}

func setupBenchCfg(b *testing.B, yaml string) *bench {
	b.Helper()
	m := meshtest.New(b, streams.Options{})
	js, nc := m.JS, m.JS.Conn()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	ms := metrics.New(prometheus.NewRegistry())
	svc, err := admission.New(admission.Config{App: cfg}, m, slog.New(slog.DiscardHandler), ms)
	if err != nil {
		b.Fatal(err)
	}
	return &bench{js: js, nc: nc, ms: ms, svc: svc, cfg: cfg, mesh: m}
}

func queued(i int) []byte { return queuedAs(i, job.Standard) }

func queuedAs(i int, p job.Priority) []byte {
	est := job.Estimate{PromptTokens: 150, MaxTokens: 50}
	data, _ := json.Marshal(task.Task{
		Job:         job.Job{ID: fmt.Sprintf("00000000-0000-7000-8000-%012d", i), Tenant: "t", Priority: p, Provider: "p", Request: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)},
		Model:       "m",
		Estimate:    &est,
		SubmittedAt: time.Now(),
	})
	return data
}

func (bn *bench) waitDispatched(b *testing.B, n int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, _ := bn.js.Stream(ctx, streams.Dispatch)
	if !natstest.Poll(ctx, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs >= uint64(n)
	}) {
		b.Fatalf("%d jobs not dispatched in 5 minutes", n)
	}
}

func (bn *bench) report(b *testing.B, n int, elapsed time.Duration) {
	var m dto.Metric
	_ = bn.ms.BudgetWrites.Write(&m)
	writes := m.GetCounter().GetValue()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(writes/float64(n), "kv-writes/job")
}

// BenchmarkAdmissionThroughput: a backlog of b.N jobs with budget to spare;
// how fast admission reserves and dispatches them, and how many budget-store
// writes that takes per job.
func BenchmarkAdmissionThroughput(b *testing.B) {
	b.Run("tenant-unlimited", func(b *testing.B) { admissionThroughput(b, tenantUnlimited) })
	b.Run("tenant-limited", func(b *testing.B) { admissionThroughput(b, tenantLimited) })
}

func admissionThroughput(b *testing.B, tenant string) {
	bn := setupBench(b, tenant)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range b.N {
		if _, err := bn.js.PublishAsync(job.QueueSubject(job.Standard, "t"), queued(i)); err != nil {
			b.Fatal(err)
		}
	}
	<-bn.js.PublishAsyncComplete()
	b.ResetTimer()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- bn.svc.Run(ctx) }()
	bn.waitDispatched(b, b.N)
	elapsed := time.Since(start)
	b.StopTimer()
	bn.report(b, b.N, elapsed)
	cancel()
	<-done
}

// BenchmarkAdmissionAt1000PerSecond offers jobs at 1,000 per second, as a
// steady stream rather than a backlog, and reports budget-store writes per
// job (the target is at most 0.05).
func BenchmarkAdmissionAt1000PerSecond(b *testing.B) {
	b.Run("tenant-unlimited", func(b *testing.B) { admissionAt1000(b, tenantUnlimited, job.Standard) })
	b.Run("tenant-limited", func(b *testing.B) { admissionAt1000(b, tenantLimited, job.Standard) })
	b.Run("interactive", func(b *testing.B) { admissionAt1000(b, tenantUnlimited, job.Interactive) })
}

func admissionAt1000(b *testing.B, tenant string, p job.Priority) {
	bn := setupBench(b, tenant)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- bn.svc.Run(ctx) }()
	n := max(b.N, 3000)
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		natstest.Pace(ctx, start, i, time.Millisecond)
		if _, err := bn.js.PublishAsync(job.QueueSubject(p, "t"), queuedAs(i, p)); err != nil {
			b.Fatal(err)
		}
	}
	<-bn.js.PublishAsyncComplete()
	bn.waitDispatched(b, n)
	elapsed := time.Since(start)
	b.StopTimer()
	bn.report(b, n, elapsed)
	cancel()
	<-done
}

// BenchmarkAdmissionPaced: a backlog against a 600-RPM model (a per-second
// cap of 10, equal to the average pace), admitted by two admission
// processes sharing one schedule; the send instants they plan must fill
// the minute once a new model's 10-s warm-up is over (fill: requests
// planned in [12 s, 22 s), over 10 s of the limit; at most 1).
func BenchmarkAdmissionPaced(b *testing.B) {
	bn := setupBenchCfg(b, `
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 600, tpm: 2000000000}]
tenants: [{name: t}]
`)
	second, err := admission.New(admission.Config{App: bn.cfg}, bn.mesh, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 300 {
		if _, err := bn.js.PublishAsync(job.QueueSubject(job.Standard, "t"), queued(i)); err != nil {
			b.Fatal(err)
		}
	}
	<-bn.js.PublishAsyncComplete()
	b.ResetTimer()
	start := time.Now()
	go func() { _ = bn.svc.Run(ctx) }()
	go func() { _ = second.Run(ctx) }()
	// The measured window: what two processes dispatch in 23 s is the
	// figure, so time is the logic here.
	time.Sleep(23 * time.Second)
	b.StopTimer()
	st, _ := bn.js.Stream(ctx, streams.Dispatch)
	info, _ := st.Info(ctx)
	var planned []time.Time
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var j task.Task
		if json.Unmarshal(m.Data, &j) == nil && j.Reservation != nil {
			planned = append(planned, j.Reservation.SendAt)
		}
	}
	n := 0
	for _, at := range planned {
		if d := at.Sub(start); d >= 12*time.Second && d < 22*time.Second {
			n++
		}
	}
	if testing.Verbose() {
		sort.Slice(planned, func(i, j int) bool { return planned[i].Before(planned[j]) })
		for i := 1; i < len(planned); i++ {
			b.Logf("%6.3f +%4dms", planned[i].Sub(start).Seconds(), planned[i].Sub(planned[i-1]).Milliseconds())
		}
	}
	b.ReportMetric(float64(n)/100, "fill")
	b.ReportMetric(float64(len(planned)), "planned")
}
