package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// unlimitedConfig is one simulated provider with no rate limits (so calls
// are not paced) and room for conc calls.
func unlimitedConfig(simURL string, conc int) string { return modelConfig(simURL, 0, conc) }

// modelConfig is one simulated provider whose model is limited to rpm
// requests a minute (0: unlimited, not paced) with room for conc calls.
func modelConfig(simURL string, rpm, conc int) string {
	return fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: gpt-4o-mini, rpm: %d, tpm: 0, max_concurrency: %d}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
limits:
  max_waiters_per_tenant: 1000   # one tenant holds every stream
`, simURL, rpm, conc)
}

var streamBenchBody = []byte(`{"model":"gpt-4o-mini","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`)

// firstToken POSTs a streamed request and returns the time to the first
// content delta, then reads the stream to its end ([DONE]).
func firstToken(ctx context.Context, hc *http.Client, url, key string, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var ttft time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if ttft == 0 && strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			ttft = time.Since(start)
		}
		if line == "data: [DONE]" {
			if ttft == 0 {
				return 0, fmt.Errorf("no content")
			}
			return ttft, nil
		}
		if strings.HasPrefix(line, `data: {"error"`) {
			return 0, fmt.Errorf("stream error: %s", line)
		}
	}
	return 0, fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
}

func quantile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkStreamTTFT measures what Sluice adds to the time to first
// token, unloaded: the same streamed request sent one at a time, in turn
// directly to the simulator and through Sluice (HTTP in, queue,
// admission, executor, STREAMS, HTTP relay out), on a model without
// limits (unpaced) and on a paced one with room (6,000 RPM, which the
// simulator enforces). added_* is through Sluice minus direct, per
// quantile. "fresh" is the paced model on a node that has made no call
// (only the direct path is warmed up): run it 20x, as a new node's first
// calls; "fresh-sdk" is the same through the official OpenAI SDK. Run:
//
//	go test -run XXX -bench 'StreamTTFT/(un)?paced' -benchtime 300x ./cmd/sluice/
//	go test -run XXX -bench StreamTTFT/fresh -benchtime 20x -count 5 ./cmd/sluice/
func BenchmarkStreamTTFT(b *testing.B) {
	for _, c := range []struct {
		name  string
		rpm   int
		fresh bool
		sdk   bool
	}{{"unpaced", 0, false, false}, {"paced", 6000, false, false}, {"fresh", 6000, true, false}, {"fresh-sdk", 6000, true, true}} {
		b.Run(c.name, func(b *testing.B) { benchTTFT(b, c.rpm, c.fresh, c.sdk) })
	}
}

// ttftFunc measures one stream's time to first token from base (…/v1).
type ttftFunc func(ctx context.Context, base, key string) (time.Duration, error)

// rawTTFT streams streamBenchBody over plain HTTP.
func rawTTFT(hc *http.Client) ttftFunc {
	return func(ctx context.Context, base, key string) (time.Duration, error) {
		return firstToken(ctx, hc, base+"/chat/completions", key, streamBenchBody)
	}
}

// sdkTTFT streams the same request through the official OpenAI SDK (one
// client per base URL, as an application keeps one), no retries.
func sdkTTFT(hc *http.Client) ttftFunc {
	var mu sync.Mutex
	clients := map[string]openai.Client{}
	return func(ctx context.Context, base, key string) (time.Duration, error) {
		mu.Lock()
		c, ok := clients[base]
		if !ok {
			c = openai.NewClient(option.WithBaseURL(base), option.WithAPIKey(key), option.WithHTTPClient(hc), option.WithMaxRetries(0))
			clients[base] = c
		}
		mu.Unlock()
		start := time.Now()
		st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(16),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello to the benchmark.")}})
		defer st.Close()
		var ttft time.Duration
		for st.Next() {
			if ch := st.Current(); ttft == 0 && len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				ttft = time.Since(start)
			}
		}
		if err := st.Err(); err != nil {
			return 0, err
		}
		if ttft == 0 {
			return 0, fmt.Errorf("no content")
		}
		return ttft, nil
	}
}

func benchTTFT(b *testing.B, rpm int, fresh, sdk bool) {
	_, simURL := systest.StartSim(b, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: rpm}}, TTFT: 20 * time.Millisecond, PerToken: time.Millisecond, APIKeys: []string{"sim-secret"}})
	n := systest.Start(b, modelConfig(simURL, rpm, 64), systest.Env)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	first := rawTTFT(hc)
	if sdk {
		first = sdkTTFT(hc)
	}
	ctx := context.Background()
	for range 20 { // warm up both paths
		if _, err := first(ctx, simURL+"/v1", "sim-secret"); err != nil {
			b.Fatal(err)
		}
		if fresh {
			continue
		}
		if _, err := first(ctx, n.HTTP+"/v1", "acme-key"); err != nil {
			b.Fatal(err)
		}
	}
	var direct, via []time.Duration
	b.ResetTimer()
	for b.Loop() {
		d, err := first(ctx, simURL+"/v1", "sim-secret")
		if err != nil {
			b.Fatal(err)
		}
		v, err := first(ctx, n.HTTP+"/v1", "acme-key")
		if err != nil {
			b.Fatal(err)
		}
		direct, via = append(direct, d), append(via, v)
	}
	b.StopTimer()
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		b.ReportMetric(ms(quantile(direct, p.q)), "direct_"+p.name+"_ms")
		b.ReportMetric(ms(quantile(via, p.q)), "sluice_"+p.name+"_ms")
		b.ReportMetric(ms(quantile(via, p.q)-quantile(direct, p.q)), "added_"+p.name+"_ms")
	}
}

// BenchmarkStream500 streams 500 requests at once through Sluice (each 100
// tokens, 10 ms apart: about a second of streaming) and reports time to
// first token, wall time, the process's CPU time and peak memory. Sluice,
// the simulator and the 500 clients share the process, so CPU and memory
// are upper bounds for Sluice alone. Run:
//
//	go test -run XXX -bench Stream500 -benchtime 1x ./cmd/sluice/
func BenchmarkStream500(b *testing.B) {
	const streams = 500
	_, simURL := systest.StartSim(b, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini"}}, TTFT: 200 * time.Millisecond, PerToken: 10 * time.Millisecond,
		OutputTokens: func(max int, _ []byte) int { return max }, APIKeys: []string{"sim-secret"}})
	n := systest.Start(b, unlimitedConfig(simURL, 1024), systest.Env)
	body := []byte(`{"model":"gpt-4o-mini","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"Tell me a story."}]}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: 0}}
	ctx := context.Background()
	if _, err := firstToken(ctx, hc, n.HTTP+"/v1/chat/completions", "acme-key", body); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		runtime.GC()
		var ru0 syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		var mu sync.Mutex
		var ttfts []time.Duration
		var failed int
		var firstErr error
		var peakHeap uint64
		stop := make(chan struct{})
		go func() { // sample the heap while streams run
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			var ms runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					runtime.ReadMemStats(&ms)
					mu.Lock()
					peakHeap = max(peakHeap, ms.HeapInuse)
					mu.Unlock()
				}
			}
		}()
		start := time.Now()
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				d, err := firstToken(ctx, hc, n.HTTP+"/v1/chat/completions", "acme-key", body)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if failed++; firstErr == nil {
						firstErr = err
					}
					return
				}
				ttfts = append(ttfts, d)
			})
		}
		wg.Wait()
		wall := time.Since(start)
		close(stop)
		var ru1 syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
		if failed > 0 || len(ttfts) != streams {
			b.Fatalf("%d of %d streams failed; the first: %v", failed, streams, firstErr)
		}
		b.ReportMetric(ms(quantile(ttfts, 0.5)), "ttft_p50_ms")
		b.ReportMetric(ms(quantile(ttfts, 0.99)), "ttft_p99_ms")
		b.ReportMetric(wall.Seconds(), "wall_s")
		b.ReportMetric(cpu.Seconds(), "cpu_s")
		b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cores")
		b.ReportMetric(float64(peakHeap)/(1<<20), "peak_heap_MiB")
		b.ReportMetric(float64(maxRSS())/(1<<20), "max_rss_MiB")
	}
}

// maxRSS is the process's peak resident set (VmHWM), in bytes.
func maxRSS() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb)
			return kb << 10
		}
	}
	return 0
}
