package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/streams"
)

// watched is a NATS connection whose asynchronous errors (permission
// violations) the test reads.
type watched struct {
	name string
	nc   *nats.Conn
	errs chan error
}

func connectWatched(t *testing.T, name, url string, opts ...nats.Option) *watched {
	t.Helper()
	w := &watched{name: name, errs: make(chan error, 256)}
	nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case w.errs <- err:
		default:
		}
	}))...)
	if err != nil {
		t.Fatalf("%s: connect: %v", name, err)
	}
	t.Cleanup(nc.Close)
	w.nc = nc
	return w
}

// closed is a channel closed once the connection is closed.
func (w *watched) closed(t *testing.T) <-chan struct{} {
	t.Helper()
	ch := make(chan struct{})
	w.nc.SetClosedHandler(func(*nats.Conn) { close(ch) })
	if w.nc.IsClosed() {
		return closedChan
	}
	return ch
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// refused publishes to (op "pub") or subscribes to (op "sub") subject and
// checks that the server answers with a permissions violation naming it.
func (w *watched) refused(t *testing.T, op, subject string) {
	t.Helper()
	for len(w.errs) > 0 {
		<-w.errs
	}
	want := "publish to \"" + strings.ToLower(subject) + "\""
	switch op {
	case "pub":
		if err := w.nc.Publish(subject, []byte(`{}`)); err != nil {
			t.Fatalf("%s: publish %s: %v", w.name, subject, err)
		}
	case "sub":
		want = "subscription to \"" + strings.ToLower(subject) + "\""
		sub, err := w.nc.SubscribeSync(subject)
		if err != nil {
			t.Fatalf("%s: subscribe %s: %v", w.name, subject, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatalf("%s: flush: %v", w.name, err)
	}
	timeout := time.After(3 * time.Second)
	for {
		select {
		case err := <-w.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), want) {
				return
			}
		case <-timeout:
			t.Errorf("%s: %s %q was not refused with a permissions violation", w.name, op, subject)
			return
		}
	}
}

// TestNATSTrustBoundary runs `sluice up` as four OS processes, one service
// each, on an embedded NATS with tenants: nobody gets in anonymously; a
// tenant's NATS user (its name, its API key) submits and reads its own
// results and is refused everything else; a service's user is refused what
// its role does not need; and the services themselves, each under its own
// role, complete jobs without a single permissions violation.
func TestNATSTrustBoundary(t *testing.T) {
	t.Parallel()
	bin := sluiceBinary(t)
	const model = "gpt-4o-mini"
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 100000, TPM: 10000000}}, APIKeys: []string{"sim-secret"}})
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(systest.SimConfig(simURL, model, 100000, 10000000, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	front := startChild(t, bin, []string{"--config", cfgPath, "--data", data, "--nats-listen", "127.0.0.1:0",
		"--http", "127.0.0.1:0", "--services", "result"}, systest.Env)
	procs := []*child{front}
	for _, s := range []string{"ingest", "admission", "executor"} {
		procs = append(procs, startChild(t, bin, []string{"--config", cfgPath, "--nats-url", front.NATS, "--data", data,
			"--http", "127.0.0.1:0", "--services", s}, systest.Env))
	}
	ingestHTTP := procs[1].HTTP
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	// The secrets file is private.
	if st, err := os.Stat(natsauth.SecretsPath(data)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, mode %v; want mode 0600", natsauth.SecretsFile, err, st.Mode().Perm())
	}

	// Nobody gets in anonymously, nor with a wrong key.
	for name, opts := range map[string][]nats.Option{
		"anonymous":              nil,
		"acme with a wrong key":  {client.TenantUser("acme", "not-the-key")},
		"acme with globex's key": {client.TenantUser("acme", systest.Env["GLOBEX_KEY"])},
	} {
		nc, err := nats.Connect(front.NATS, append(opts, nats.Timeout(3*time.Second))...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected, want an authorization error", name)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: %v, want nats.ErrAuthorization", name, err)
		}
	}

	// Tenant A submits over NATS and reads its own result.
	acme := connectWatched(t, "acme", front.NATS, client.TenantUser("acme", systest.Env["ACME_KEY"]))
	acl, err := client.New(acme.nc)
	if err != nil {
		t.Fatal(err)
	}
	res, err := acl.Do(ctx, &job.Job{Tenant: "acme", Request: systest.ChatBody(model, 5, 16)})
	if err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("acme's job over NATS: %+v, %v; want succeeded", res, err)
	}
	if _, err := acl.Lookup(ctx, "acme", res.JobID); !errors.Is(err, client.ErrTenantConnection) {
		t.Errorf("Lookup on a tenant connection = %v, want ErrTenantConnection", err)
	}
	all := make(chan *job.Result, 4)
	sub, err := acl.Subscribe("acme", func(r *job.Result) { all <- r })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	// ... and nothing else: not B's results, not QUEUE or DISPATCH, no
	// JetStream API, no bucket, no other tenant's intake or replies.
	for _, s := range []string{job.ResultPrefix + "globex.>", job.ResultPrefix + ">", job.QueuePrefix + ">", job.DispatchPrefix + ">",
		job.StorePrefix + ">", job.IntakePrefix + "acme", client.InboxPrefix("globex") + ".>", "_INBOX.>", "sluice.signal.pause.>", ">"} {
		acme.refused(t, "sub", s)
	}
	pubs := []string{job.IntakeSubject("globex"), job.WaitSubject("globex"), job.QueueSubject(job.Standard, "acme"),
		job.DispatchSubject("sim", model), job.StoreSubject("acme", job.NewID()), job.ResultSubject("acme", job.NewID()),
		"sluice.signal.pause.sim." + job.ModelToken(model), "$JS.API.INFO", "$JS.API.STREAM.LIST",
		"$JS.API.STREAM.INFO." + streams.Queue, "$JS.API.STREAM.PURGE." + streams.DLQ,
		"$JS.API.CONSUMER.MSG.NEXT." + streams.Dispatch + ".executor-sim-" + job.ModelToken(model)}
	buckets, err := streams.Buckets()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range buckets {
		k := "KV_" + b.Bucket
		pubs = append(pubs, "$KV."+b.Bucket+".x", "$JS.API.STREAM.INFO."+k, "$JS.API.STREAM.MSG.GET."+k,
			"$JS.API.DIRECT.GET."+k+".$KV."+b.Bucket+".x")
		acme.refused(t, "sub", "$KV."+b.Bucket+".>")
	}
	for _, s := range pubs {
		acme.refused(t, "pub", s)
	}
	ajs, _ := jetstream.New(acme.nc)
	kctx, kcancel := context.WithTimeout(ctx, time.Second)
	if _, err := ajs.KeyValue(kctx, streams.BucketResults); err == nil {
		t.Error("acme bound the results bucket")
	}
	kcancel()
	// Still usable after the refusals, and its subscription saw its jobs only.
	if res, err := acl.Do(ctx, &job.Job{Tenant: "acme", Request: systest.ChatBody(model, 5, 16)}); err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("acme's second job: %+v, %v", res, err)
	}
	select {
	case r := <-all:
		if r.Tenant != "acme" {
			t.Errorf("acme's subscription got a result of %q", r.Tenant)
		}
	case <-ctx.Done():
		t.Fatal("acme's subscription saw no result")
	}
	globex := connectWatched(t, "globex", front.NATS, client.TenantUser("globex", systest.Env["GLOBEX_KEY"]))
	globex.refused(t, "sub", job.ResultPrefix+"acme.>")
	globex.refused(t, "pub", job.IntakeSubject("acme"))

	// A service's user is refused what its role does not need.
	role := func(set string) *watched {
		opts, _, err := natsauth.Conn{Config: &config.Config{}, DataDir: data, Set: set}.Options()
		if err != nil {
			t.Fatal(err)
		}
		return connectWatched(t, set, front.NATS, opts...)
	}
	ex := role(natsauth.Executor)
	ejs, _ := jetstream.New(ex.nc)
	if _, err := ejs.Stream(ctx, streams.DLQ); err != nil {
		t.Errorf("executor cannot look up the DLQ stream it publishes to: %v", err)
	}
	for _, s := range []string{job.IntakeSubject("acme"), job.ResultSubject("acme", job.NewID()), "$JS.API.STREAM.MSG.GET." + streams.DLQ,
		"$JS.API.STREAM.DELETE." + streams.Queue, "$KV." + streams.BucketResults + ".x", "$JS.API.CONSUMER.MSG.NEXT." + streams.Queue + ".admission"} {
		ex.refused(t, "pub", s)
	}
	ex.refused(t, "sub", job.ResultPrefix+">")
	ex.refused(t, "sub", job.QueuePrefix+">")
	ing := role(natsauth.Ingest)
	ing.refused(t, "pub", job.DispatchSubject("sim", model))
	ing.refused(t, "pub", "$KV."+streams.BucketBudgets+".x")
	adm := role(natsauth.Admission)
	adm.refused(t, "pub", job.IntakeSubject("acme"))
	adm.refused(t, "pub", "$KV."+streams.BucketResults+".x")

	// A tenant's messages are no larger than its largest job: one on its
	// own wait-hint subject is refused by the server (which allows 8 MiB
	// to the services), and globex's chat below is answered all the same.
	big := connectWatched(t, "acme", front.NATS, client.TenantUser("acme", systest.Env["ACME_KEY"]), nats.NoReconnect())
	if err := big.nc.Publish(job.WaitSubject("acme"), make([]byte, 4<<20)); err == nil {
		_ = big.nc.Flush()
		select {
		case err := <-big.errs:
			if !strings.Contains(strings.ToLower(err.Error()), "maximum payload") {
				t.Errorf("acme's 4 MiB wait hint: %v, want a maximum payload violation", err)
			}
		case <-big.closed(t):
			if err := big.nc.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "maximum payload") {
				t.Errorf("acme's 4 MiB wait hint: connection closed with %v, want a maximum payload violation", err)
			}
		case <-ctx.Done():
			t.Error("acme's 4 MiB wait hint was not refused")
		}
	} else if !errors.Is(err, nats.ErrMaxPayload) {
		// The server may refuse the message while it is still being
		// written: it closes the connection and the write fails (reset,
		// broken pipe). The connection must then be closed by the server.
		select {
		case <-big.closed(t):
		case <-ctx.Done():
			t.Fatalf("acme's 4 MiB wait hint: publish failed (%v) but the connection stayed open", err)
		}
	}

	// The HTTP paths exercise ingest's and result's waits and reads.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ingestHTTP+"/v1/chat/completions",
		bytes.NewReader(systest.ChatBody(model, 5, 16)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+systest.Env["GLOBEX_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("X-Sluice-Job-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("chat completion over HTTP: %d %s", resp.StatusCode, body)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, front.HTTP+"/v1/jobs/"+id+"?wait=10s", nil)
	req.Header.Set("Authorization", "Bearer "+systest.Env["GLOBEX_KEY"])
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "succeeded") {
		t.Errorf("GET /v1/jobs/%s: %d %s", id, resp.StatusCode, body)
	}

	// The operator's CLI finds its identity in the data directory, and
	// says what to do without it.
	var out, errOut bytes.Buffer
	noenv := func(string) string { return "" }
	if err := run(ctx, []string{"queue", "--nats-url", front.NATS, "--data", data}, noenv, &out, &errOut); err != nil {
		t.Errorf("sluice queue --data: %v (%s)", err, errOut.String())
	}
	err = run(ctx, []string{"queue", "--nats-url", front.NATS, "--data", t.TempDir()}, noenv, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--data") {
		t.Errorf("sluice queue without an identity = %v, want an error naming --data", err)
	}

	// Every service ran under its own role without a violation.
	if got := simSrv.Stats().Requests[http.StatusOK]; got < 3 {
		t.Errorf("the provider answered %d requests, want 3", got)
	}
	for _, p := range procs {
		logData, _ := os.ReadFile(p.log)
		if strings.Contains(strings.ToLower(string(logData)), "permissions violation") {
			t.Errorf("%s logged a permissions violation:\n%s", p.log, logData)
		}
		if strings.Contains(string(logData), "deployment health: watch") {
			t.Errorf("%s could not watch the deployments' health:\n%s", p.log, logData)
		}
	}
}

// TestNATSURLRedacted: credentials in --nats-url never reach a log line,
// stdout or an error.
func TestNATSURLRedacted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("providers: [{name: p, base_url: http://127.0.0.1:1/v1, models: [{name: m}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(ctx, []string{"up", "--config", cfg, "--nats-url", "nats://alice:hunter2@127.0.0.1:1", "--http", "off", "--data", t.TempDir(), "--log-level", "debug"},
		func(string) string { return "" }, &stdout, &stderr)
	all := fmt.Sprint(err) + stdout.String() + stderr.String()
	if err == nil {
		t.Fatal("sluice up connected to a closed port")
	}
	if strings.Contains(all, "hunter2") || strings.Contains(all, "alice") {
		t.Errorf("the NATS credentials were printed: %s", all)
	}
	if !strings.Contains(all, "REDACTED@127.0.0.1:1") {
		t.Errorf("the URL is not named (redacted) in what went wrong: %s", all)
	}
}

// TestUpOverTLS: a single node with its embedded listener over TLS. Its own
// services reach the server through the in-process pipe (no TLS, same
// permissions); everyone else must use TLS: a tenant over TLS submits and
// gets its result, a plain connection is refused, and the node's jobs run.
func TestUpOverTLS(t *testing.T) {
	t.Parallel()
	const model = "gpt-4o-mini"
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 100000, TPM: 10000000}}, APIKeys: []string{"sim-secret"}})
	cert, key, err := natsauth.SelfSigned(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := systest.StartLogged(t, systest.SimConfig(simURL, model, 100000, 10000000,
		fmt.Sprintf("server:\n  nats:\n    listen_tls: {cert: %q, key: %q}\n", cert, key)), systest.Env)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	plain := strings.Replace(n.NATS, "tls://", "nats://", 1)
	if nc, err := nats.Connect(plain, client.TenantUser("acme", systest.Env["ACME_KEY"]), nats.Timeout(3*time.Second)); err == nil {
		nc.Close()
		t.Error("a tenant connected without TLS to a TLS listener")
	}
	nc, err := nats.Connect(n.NATS, client.TenantUser("acme", systest.Env["ACME_KEY"]), nats.RootCAs(cert))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.TLSConnectionState(); err != nil {
		t.Errorf("the tenant's connection is not TLS: %v", err)
	}
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: systest.ChatBody(model, 5+i, 16)})
		if err != nil || res.Status != job.StatusSucceeded {
			t.Fatalf("job %d over TLS: %+v, %v; want succeeded", i, res, err)
		}
	}
	if got := simSrv.Stats().Completed; got != 3 {
		t.Errorf("provider completed %d calls, want 3", got)
	}
}
