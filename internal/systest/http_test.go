package systest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// attempts counts the HTTP attempts an SDK makes and remembers the retry
// count header of each.
type attempts struct {
	mu     sync.Mutex
	counts []string
}

func (a *attempts) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	a.mu.Lock()
	a.counts = append(a.counts, req.Header.Get("X-Stainless-Retry-Count"))
	a.mu.Unlock()
	return next(req)
}

func (a *attempts) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.counts...)
}

// waitTerminal long-polls a job until it is terminal.
func waitTerminal(t *testing.T, ctx context.Context, base, key, id string) map[string]any {
	t.Helper()
	for ctx.Err() == nil {
		if j := GetJob(t, ctx, base, key, id, "10s"); j["result"] != nil {
			return j
		}
	}
	t.Fatalf("job %s not terminal before the test's deadline", id)
	return nil
}

// totalRequests is every request the simulator answered.
func totalRequests(st sim.Stats) int64 {
	var n int64
	for _, c := range st.Requests {
		n += c
	}
	return n
}

// TestSDKWaitTimeoutPaysOnce: with the official OpenAI Go SDK on its
// default retries, a 504 wait_timeout is not retried (x-should-retry:
// false), names the job, and the provider is called once.
func TestSDKWaitTimeoutPaysOnce(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 100, TPM: 100000}},
		TTFT: 1500 * time.Millisecond, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 100, 100000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var a attempts
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"), option.WithMiddleware(a.middleware))
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("slow one")}, MaxTokens: openai.Int(8),
	}, option.WithHeader("X-Sluice-Wait-Timeout", "300ms"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || apiErr.Code != "wait_timeout" {
		t.Fatalf("chat completion with a 300ms wait on a 1.5s provider: got %v, want a 504 wait_timeout", err)
	}
	if got := a.seen(); len(got) != 1 {
		t.Errorf("SDK attempts (X-Stainless-Retry-Count): got %q, want exactly one (no retry of a wait_timeout)", got)
	}
	id := apiErr.Response.Header.Get("X-Sluice-Job-Id")
	if id == "" || !strings.Contains(apiErr.Message, id) || apiErr.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("504: X-Sluice-Job-Id %q, x-should-retry %q, message %q; want the job id in both and x-should-retry false",
			id, apiErr.Response.Header.Get("X-Should-Retry"), apiErr.Message)
	}
	j := waitTerminal(t, ctx, n.HTTP, "acme-key", id)
	if j["status"] != "succeeded" {
		t.Errorf("the job after its caller's wait ended: %v, want succeeded", j["status"])
	}
	if st := simSrv.Stats(); st.Completed != 1 || totalRequests(st) != 1 {
		t.Errorf("provider ledger: %d completed, %d requests (%v); want exactly one call", st.Completed, totalRequests(st), st.Requests)
	}

	// Waits the server will not hold are refused at once, naming the header.
	for _, v := range []string{"1e300", "1000h", "NaN", "-1"} {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
		}, option.WithHeader("X-Sluice-Wait-Timeout", v), option.WithMaxRetries(0))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "X-Sluice-Wait-Timeout") {
			t.Errorf("X-Sluice-Wait-Timeout %q: got %v, want 400 naming the header", v, err)
		}
	}
	if st := simSrv.Stats(); totalRequests(st) != 1 {
		t.Errorf("provider requests after refused waits: %d, want still 1", totalRequests(st))
	}
}

// TestSDKRetryPaysOnce: the official OpenAI Go SDK retries a request whose
// connection dropped (its first attempt gives up client-side) with the
// same body and X-Stainless-Retry-Count: 1, and no Idempotency-Key. The
// retry joins the job of the first attempt: one provider call. The
// server's read and write timeouts (1s) are shorter than the wait, which
// must not cut it. Nothing secret or prompt-like reaches the log.
func TestSDKRetryPaysOnce(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 100, TPM: 100000}},
		TTFT: 2 * time.Second, APIKeys: []string{"sim-secret"}})
	var stderr SyncBuffer
	n := StartWith(t, SimConfig(simURL, "gpt-4o-mini", 100, 100000, "server:\n  http_timeouts: {read: 1s, write: 1s}\n"),
		Setup{Env: Env, Log: &stderr, Level: slog.LevelDebug})
	WaitReady(t, n.HTTP)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var a attempts
	// The first attempt's connection is dropped after 400 ms, as a proxy
	// or a client-side timeout would; the SDK sees a transport error and
	// retries. (option.WithRequestTimeout does not do it: openai-go v3
	// returns at once when its per-attempt context expires.)
	drop := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if req.Header.Get("X-Stainless-Retry-Count") != "0" {
			return next(req)
		}
		actx, acancel := context.WithTimeout(req.Context(), 400*time.Millisecond)
		defer acancel()
		resp, err := next(req.WithContext(actx))
		if err == nil {
			resp.Body.Close()
			return nil, errors.New("the first attempt was answered; want it dropped")
		}
		return nil, fmt.Errorf("connection dropped: %w", io.ErrUnexpectedEOF)
	}
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"), option.WithMiddleware(a.middleware, drop))
	var resp *http.Response
	out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("the secret plan")}, MaxTokens: openai.Int(8),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat completion whose first attempt dropped: %v (attempts %q)", err, a.seen())
	}
	if got := a.seen(); len(got) != 2 || got[0] != "0" || got[1] != "1" {
		t.Errorf("SDK attempts (X-Stainless-Retry-Count): got %q, want [0 1]", got)
	}
	if len(out.Choices) != 1 || out.Choices[0].Message.Content == "" {
		t.Errorf("retried completion: got %+v, want one choice with content", out.Choices)
	}
	if st := simSrv.Stats(); st.Completed != 1 || totalRequests(st) != 1 {
		t.Errorf("provider ledger: %d completed, %d requests (%v); want exactly one call", st.Completed, totalRequests(st), st.Requests)
	}

	// The same body sent again as a new request (retry count 0) is a new
	// operation: identical prompts are not merged.
	a.counts = nil
	plain := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"))
	if _, err := plain.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("the secret plan")}, MaxTokens: openai.Int(8),
	}); err != nil {
		t.Fatalf("the same prompt as a new request: %v", err)
	}
	if st := simSrv.Stats(); st.Completed != 2 {
		t.Errorf("provider completed %d calls after a second, new request, want 2", st.Completed)
	}
	for _, secret := range []string{"acme-key", "sim-secret", "the secret plan", "Bearer"} {
		if strings.Contains(stderr.String(), secret) {
			t.Errorf("the debug log contains %q", secret)
		}
	}
}

// TestWaitersPerTenant: a tenant's concurrent waits beyond
// limits.max_waiters_per_tenant get 429 too_many_waiters; another tenant
// is not affected; waits above limits.max_wait are refused.
func TestWaitersPerTenant(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 100, TPM: 100000}},
		TTFT: 5 * time.Second, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 100, 100000, "limits:\n  max_waiters_per_tenant: 1\n  max_wait: 1m\n"), Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := httpSubmit(ctx, n.HTTP, "acme-key", ChatBody("gpt-4o-mini", 3, 8), false)
	if err != nil {
		t.Fatal(err)
	}
	get := func(key, wait string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.HTTP+"/v1/jobs/"+id+"?wait="+wait, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	held := make(chan struct{})
	go func() { // takes acme's one waiter slot and holds it until the job ends
		defer close(held)
		natstest.Poll(ctx, func() bool { c, _ := get("acme-key", "20s"); return c != http.StatusTooManyRequests })
	}()
	defer func() { <-held }()
	var code int
	var body string
	// Until the goroutine above holds the slot (asking seldom, so that a
	// wait of this loop's does not keep the slot from it).
	pctx, pcancel := context.WithTimeout(ctx, 4*time.Second)
	natstest.PollEvery(pctx, 200*time.Millisecond, func() bool {
		code, body = get("acme-key", "100ms")
		return code == http.StatusTooManyRequests
	})
	pcancel()
	if code != http.StatusTooManyRequests || !strings.Contains(body, "too_many_waiters") {
		t.Errorf("a second wait of a tenant allowed one: got %d %s, want 429 too_many_waiters", code, body)
	}
	if code, body := get("globex-key", "300ms"); code != http.StatusNotFound {
		t.Errorf("another tenant's wait (on a job it does not own): got %d %s, want 404, not 429", code, body)
	}
	if code, body := get("acme-key", "2m"); code != http.StatusBadRequest || !strings.Contains(body, "1m0s") {
		t.Errorf("a wait above limits.max_wait: got %d %s, want 400 naming the limit", code, body)
	}
}

// TestHTTPTLSAndMetricsListener: with server.http_tls the API is served
// over TLS only; with server.metrics, /metrics is on its own listener and
// not on the API's.
func TestHTTPTLSAndMetricsListener(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath, pool := selfSigned(t, dir)
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 100, TPM: 100000}}, APIKeys: []string{"sim-secret"}})
	n := StartWith(t, SimConfig(simURL, "gpt-4o-mini", 100, 100000, fmt.Sprintf("server:\n  http_tls: {cert: %s, key: %s}\n", certPath, keyPath)),
		Setup{Env: Env})
	if n.Metrics == "" {
		t.Fatal("the node serves no metrics listener")
	}
	api := strings.Replace(n.HTTP, "http://", "https://", 1)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	// get asks until it has an answer other than 503 (not ready yet), or
	// for 30 s.
	get := func(url string) (code int, body string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		natstest.Poll(ctx, func() bool {
			var resp *http.Response
			if resp, err = hc.Get(url); err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			code, body = resp.StatusCode, string(b)
			return code != http.StatusServiceUnavailable
		})
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		return code, body
	}
	if code, _ := get(api + "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz over TLS: %d, want 200", code)
	}
	if code, _ := get(api + "/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics on the API listener with server.metrics set: %d, want 404", code)
	}
	if code, body := get("https://" + n.Metrics + "/metrics"); code != http.StatusOK || !strings.Contains(body, "sluice_model_limit") {
		t.Errorf("GET /metrics on the metrics listener: %d, want 200 with Sluice's metrics", code)
	}
	// Plain HTTP to the TLS listener gets no API.
	if resp, err := http.Get(n.HTTP + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP to the TLS listener: 200, want a refusal")
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certPath, keyPath string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, pool
}
