package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/embedded"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testConfig(t *testing.T, extra string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte("tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n  - {name: globex, api_key_env: GLOBEX_KEY}\n" + extra))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var env = map[string]string{"ACME_KEY": "acme-secret-key", "GLOBEX_KEY": "globex-secret-key"}

func getenv(k string) string { return env[k] }

// connect returns a connection and a channel of its asynchronous errors.
func connect(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, chan error) {
	t.Helper()
	errs := make(chan error, 64)
	nc, err := nats.Connect(url, append(opts, nats.Timeout(3*time.Second), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

func refusedPublish(t *testing.T, nc *nats.Conn, errs chan error, subject string) {
	t.Helper()
	if err := nc.Publish(subject, nil); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Errorf("publish %s: %v, want a permissions violation naming it", subject, err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("publish %s was not refused", subject)
	}
}

// TestAccountsBlockRunsInNATSServer loads the printed block into a
// real nats-server configuration file: the operator's nkey manages the
// streams, a tenant submits with its API key as password, no secret appears
// in the block, and anonymous and wrong-role access is refused.
func TestAccountsBlockRunsInNATSServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(t, "")
	sec, err := natsauth.EnsureSecrets(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	block, err := natsauth.AccountsBlock(cfg, sec, getenv, natsauth.BlockOptions{Sets: []string{"ingest-result", "executor"}, BcryptCost: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range append([]string{env["ACME_KEY"], env["GLOBEX_KEY"]}, func() []string {
		var s []string
		for _, seed := range sec.Seeds {
			s = append(s, seed)
		}
		return s
	}()...) {
		if strings.Contains(block, secret) {
			t.Fatalf("the block prints a secret:\n%s", block)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "sluice-auth.conf"), []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:-1\njetstream { store_dir: %q }\ninclude \"sluice-auth.conf\"\n", filepath.Join(dir, "js"))), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses the block: %v\n%s", err, block)
	}
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	url := s.ClientURL()

	if nc, err := nats.Connect(url); err == nil || !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("anonymous connection: %v, want an authorization error", err)
	}
	connAs := func(set string) (*nats.Conn, chan error) {
		o, id, err := natsauth.Conn{Config: cfg, DataDir: filepath.Join(dir, "data"), Set: set}.Options()
		if err != nil || id.Set != set {
			t.Fatalf("options for %s: %v, %v", set, id, err)
		}
		return connect(t, url, o...)
	}
	op, _ := connAs(natsauth.Operator)
	js, _ := jetstream.New(op)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatalf("the operator cannot ensure the streams: %v", err)
	}
	payloadRefused(t, url, "globex") // the block's account limits
	tenant, _ := connect(t, url, client.TenantUser("acme", env["ACME_KEY"]))
	cl, err := client.New(tenant)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Request: []byte(`{}`)}); err != nil {
		t.Errorf("acme's submission with its own user: %v", err)
	}

	// Replies stay in the tenant's account: a wait hint and an intake
	// acknowledgement aimed at globex's results or a bucket reach neither.
	ir, irErrs := connAs("ingest-result")
	if _, err := ir.QueueSubscribe(job.WaitPrefix+"*", "ingest", func(m *nats.Msg) { _ = m.Respond([]byte(`{"retry_after_ms":1}`)) }); err != nil {
		t.Fatal(err)
	}
	_ = ir.Flush()
	globex, _ := connect(t, url, client.TenantUser("globex", env["GLOBEX_KEY"]))
	seen, err := globex.SubscribeSync(job.ResultPrefix + "globex.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = globex.Flush()
	other := job.NewID()
	for _, reply := range []string{job.ResultSubject("globex", other), "$KV." + streams.BucketResults + "." + other} {
		if err := tenant.PublishRequest(job.WaitSubject("acme"), reply, nil); err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(job.IntakeSubject("acme"))
		m.Reply, m.Data = reply, []byte(`{}`)
		if err := tenant.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := tenant.Request(job.WaitSubject("acme"), nil, 3*time.Second); err != nil || string(m.Data) != `{"retry_after_ms":1}` {
		t.Errorf("acme's wait hint through its service import: %v", err)
	}
	if _, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Request: []byte(`{}`)}); err != nil {
		t.Errorf("acme's second submission: %v", err)
	}
	_ = globex.Flush()
	if m, err := seen.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("globex received %s: %q", m.Subject, m.Data)
	}
	kv, err := js.KeyValue(ctx, streams.BucketResults)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, other); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("results key %s: %v, want not found", other, err)
	}
	// Results published in the service account reach their tenant only.
	mine, err := tenant.SubscribeSync(job.ResultPrefix + "acme.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = tenant.Flush()
	if err := ir.Publish(job.ResultSubject("acme", other), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := mine.NextMsg(3 * time.Second); err != nil {
		t.Errorf("acme's result through its stream import: %v", err)
	}

	ex, exErrs := connAs("executor")
	refusedPublish(t, ex, exErrs, job.IntakeSubject("acme"))
	refusedPublish(t, ir, irErrs, job.DispatchSubject("p", "m"))
	if _, _, err := (natsauth.Conn{Config: cfg, DataDir: filepath.Join(dir, "data"), Set: "nope"}).Options(); err == nil {
		t.Error("an unknown role set got options")
	}
}

func TestSecretsFileIsPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1, err := natsauth.EnsureSecrets(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s1.Seeds) != len(natsauth.AllSets()) || len(natsauth.AllSets()) != 16 {
		t.Errorf("%d seeds for %d sets, want 16 (15 unions of four roles and the operator)", len(s1.Seeds), len(natsauth.AllSets()))
	}
	st, err := os.Stat(natsauth.SecretsPath(dir))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	s2, err := natsauth.EnsureSecrets(dir)
	if err != nil || s2.Seeds["executor"] != s1.Seeds["executor"] {
		t.Errorf("a second start changed the identities (%v)", err)
	}
	if err := os.Chmod(natsauth.SecretsPath(dir), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.LoadSecrets(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable secrets file loaded: %v, want an error saying chmod 600", err)
	}
}

func TestSetNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		roles []string
		want  string
	}{
		{[]string{"result", "ingest"}, "ingest-result"},
		{[]string{"executor"}, "executor"},
		{[]string{"result", "executor", "admission", "ingest"}, "ingest-admission-executor-result"},
		{[]string{"operator", "ingest"}, "operator"},
	} {
		if got := natsauth.SetName(tc.roles); got != tc.want {
			t.Errorf("SetName(%v) = %q, want %q", tc.roles, got, tc.want)
		}
	}
	for _, bad := range []string{"", "result-ingest", "ingest-bogus", "admin"} {
		if _, err := natsauth.ParseSet(bad); err == nil {
			t.Errorf("ParseSet(%q) accepted", bad)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://alice:hunter2@127.0.0.1:4222":               "nats://REDACTED@127.0.0.1:4222",
		"nats://s3cr3t-token@h:1,nats://h2:2":               "nats://REDACTED@h:1,nats://h2:2",
		"nats://127.0.0.1:4222":                             "nats://127.0.0.1:4222",
		"tls://u:p@[::1]:4222, nats://a:b@example.com:4222": "tls://REDACTED@[::1]:4222,nats://REDACTED@example.com:4222",
	} {
		if got := natsauth.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEmbeddedTLS serves the embedded server over TLS with authentication:
// a plain connection is refused, the node's own options (trusting the
// listener's certificate) connect as the operator, and a tenant connects
// over TLS.
func TestEmbeddedTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key, err := natsauth.SelfSigned(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, fmt.Sprintf("server:\n  nats:\n    listen_tls: {cert: %q, key: %q}\n", cert, key))
	emb, err := natsauth.ForEmbedded(cfg, filepath.Join(dir, "data"), getenv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "js"), Configure: emb.Apply})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	opOpts, _, err := natsauth.Conn{Config: cfg, DataDir: filepath.Join(dir, "data"), Set: natsauth.Operator, Embedded: true}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.ClientURL(), opOpts[:len(opOpts)-1]...); err == nil {
		nc.Close()
		t.Error("connected without TLS to a TLS listener")
	}
	op, _ := connect(t, s.ClientURL(), opOpts...)
	if !op.TLSRequired() {
		t.Error("the operator's connection is not over TLS")
	}
	tenant, _ := connect(t, s.ClientURL(), client.TenantUser("globex", env["GLOBEX_KEY"]), nats.RootCAs(cert))
	if _, err := tenant.TLSConnectionState(); err != nil {
		t.Errorf("tenant connection: %v", err)
	}
}

// TestDeployConfigsParse: deploy/nats's node files are valid nats-server
// configuration with the accounts block `sluice nats-auth` prints for the
// compose configuration in auth/sluice-auth.conf, where compose mounts it;
// without that file a node refuses to start (never without authentication).
func TestDeployConfigsParse(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../deploy/nats/nats-*.conf")
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/nats/nats-*.conf (%v)", err)
	}
	cfg, err := config.Load("../../deploy/sluice.compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sec, err := natsauth.EnsureSecrets(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{"ACME_SLUICE_KEY": "a", "GLOBEX_SLUICE_KEY": "g"}
	block, err := natsauth.AccountsBlock(cfg, sec, func(k string) string { return keys[k] },
		natsauth.BlockOptions{Sets: []string{"ingest-result", "admission", "executor"}, BcryptCost: 4})
	if err != nil {
		t.Fatal(err)
	}
	generated, bare := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(generated, "auth"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(generated, "auth", "sluice-auth.conf"), []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		without := filepath.Join(bare, filepath.Base(f))
		if err := os.WriteFile(without, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := server.ProcessConfigFile(without); err == nil {
			t.Errorf("%s without auth/sluice-auth.conf: accepted, want refused", f)
		}
		with := filepath.Join(generated, filepath.Base(f))
		if err := os.WriteFile(with, data, 0o600); err != nil {
			t.Fatal(err)
		}
		o, err := server.ProcessConfigFile(with)
		if err != nil {
			t.Errorf("%s with a generated auth/sluice-auth.conf: %v", f, err)
			continue
		}
		var names []string
		for _, a := range o.Accounts {
			names = append(names, a.Name)
		}
		slices.Sort(names)
		if want := []string{natsauth.ServiceAccount, natsauth.TenantAccount("acme"), natsauth.TenantAccount("globex")}; fmt.Sprint(names) != fmt.Sprint(want) {
			t.Errorf("%s: accounts %v, want %v", f, names, want)
		}
		if o.HTTPPort != 8222 {
			t.Errorf("%s: monitoring port %d, want 8222 (compose's prometheus-nats-exporter reads it)", f, o.HTTPPort)
		}
	}
}

// payloadRefused publishes a message larger than any job on tenant's
// wait-hint subject and checks that it is refused: by the server (a
// maximum payload violation, which closes the connection), or by the
// client once the server has told it the account's limit.
func payloadRefused(t *testing.T, url, tenant string) {
	t.Helper()
	nc, err := nats.Connect(url, client.TenantUser(tenant, env[strings.ToUpper(tenant)+"_KEY"]), nats.NoReconnect(), nats.Timeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish(job.WaitSubject(tenant), make([]byte, 2<<20)); errors.Is(err, nats.ErrMaxPayload) {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	natstest.Eventually(t, 5*time.Second, func() error {
		if err := nc.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "maximum payload") {
			return fmt.Errorf("%s's 2 MiB publish: last error %v, want a maximum payload violation", tenant, err)
		}
		return nil
	})
}

// TestTenantPayloadBounded: a tenant's account allows messages no larger
// than the largest job (limits.max_body_bytes and the envelope), on the
// embedded server: one tenant's large messages on its own wait-hint
// subject are refused by the server, and another tenant's hints are still
// answered.
func TestTenantPayloadBounded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(t, "")
	emb, err := natsauth.ForEmbedded(cfg, filepath.Join(dir, "data"), getenv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "js"), Configure: emb.Apply})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	o, _, err := natsauth.Conn{Config: cfg, DataDir: filepath.Join(dir, "data"), Set: "ingest", Embedded: true}.Options()
	if err != nil {
		t.Fatal(err)
	}
	ingest, _ := connect(t, s.ClientURL(), o...)
	if _, err := ingest.QueueSubscribe(job.WaitPrefix+"*", "ingest", func(m *nats.Msg) { _ = m.Respond([]byte(`{"retry_after_ms":1}`)) }); err != nil {
		t.Fatal(err)
	}
	_ = ingest.Flush()

	payloadRefused(t, s.ClientURL(), "acme")
	globex, _ := connect(t, s.ClientURL(), client.TenantUser("globex", env["GLOBEX_KEY"]))
	if m, err := globex.Request(job.WaitSubject("globex"), []byte(`{}`), 3*time.Second); err != nil || string(m.Data) != `{"retry_after_ms":1}` {
		t.Fatalf("globex's wait hint after acme's large message: %v, %v", m, err)
	}
	if m, err := globex.Request(job.WaitSubject("globex"), make([]byte, cfg.Limits.JobMsgBytes()), 3*time.Second); err != nil {
		t.Fatalf("a message of the largest job's size (%d, max payload %d): %v, %v", cfg.Limits.JobMsgBytes(), globex.MaxPayload(), m, err)
	}
}
