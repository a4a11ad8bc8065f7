package result

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// idFixture serves GET /v1/jobs/{id} for tenants acme (key acme-key) and,
// in open mode, any configured tenant named by X-Sluice-Tenant; known is a
// queued job of acme.
type idFixture struct {
	*fixture
	mux   *http.ServeMux
	known string
}

func setupIDs(t testing.TB) *idFixture {
	f := setup(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := job.NewID()
	if _, err := f.mesh.Results.Create(ctx, keys.Record("acme", id), []byte(`{"job_id":"`+id+`","tenant":"acme","status":"queued"}`)); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.NewAuth(map[string]string{"acme-key": "acme"}, []string{"acme"}, true))
	return &idFixture{fixture: f, mux: mux, known: id}
}

// get asks for the job at the raw (already escaped) path segment seg.
func (f *idFixture) get(seg string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/v1/jobs/x", nil)
	req.URL.RawPath, req.URL.Path = "", ""
	if u, err := url.Parse("/v1/jobs/" + seg); err == nil {
		req.URL = u
	}
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	f.mux.ServeHTTP(rec, req)
	return rec
}

// healthy fails the test unless the NATS connection is up and the known
// job still reads.
func (f *idFixture) healthy(t testing.TB, after string) {
	t.Helper()
	if nc := f.mesh.JS.Conn(); !nc.IsConnected() {
		t.Fatalf("after %s: NATS connection %v (last error %v), want connected", after, nc.Status(), nc.LastError())
	}
	if rec := f.get(f.known, nil); rec.Code != http.StatusOK {
		t.Fatalf("after %s: GET of a known job: %d %s, want 200", after, rec.Code, rec.Body)
	}
}

// An id that is not a canonical UUID names no job: 404, at once. Before, a
// 4,000-character id made a KV get whose subject exceeded the server's
// control line; the server refused it and the client closed the
// connection for good, stopping every service of the process.
func TestMalformedJobIDIsNotFound(t *testing.T) {
	t.Parallel()
	f := setupIDs(t)
	upper := strings.ToUpper(job.NewID())
	for _, seg := range []string{
		strings.Repeat("a", 4000),
		strings.Repeat("a", 4100),
		strings.Repeat("a.", 2000),
		"*", "%2A", "%3E", ">", "a.b", "%2e%2e",
		upper,
		"{" + job.NewID() + "}",
		"urn:uuid:" + job.NewID(),
		job.NewID() + "%00",
		"%E2%80%AE" + job.NewID(),
		job.NewID(), // canonical but unknown
	} {
		rec := f.get(seg, nil)
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "job_not_found") {
			t.Errorf("GET /v1/jobs/%s: got %d %s, want 404 job_not_found", clip.String(seg, 40), rec.Code, rec.Body)
		}
		f.healthy(t, "GET /v1/jobs/"+clip.String(seg, 40))
	}
	// A long-poll of a malformed id ends at once too, holding no waiter.
	if rec := f.get(strings.Repeat("b", 4000)+"?wait=30s", nil); rec.Code != http.StatusNotFound {
		t.Errorf("long-poll of a 4,000-character id: got %d, want 404", rec.Code)
	}
	f.healthy(t, "a long-poll of a 4,000-character id")
}

// FuzzJobIDPath sends GET /v1/jobs/{id} with any path segment and any
// tenant header (both reach NATS subjects or KV keys when accepted): no
// answer is a server error, and the NATS connection stays up.
func FuzzJobIDPath(f *testing.F) {
	for _, seed := range []struct{ seg, tenant, key string }{
		{"0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", "", ""},
		{strings.Repeat("a", 4100), "", ""},
		{"*", "acme", ""},
		{"%3E", "acme.>", ""},
		{"0190F6C4-8B1E-7C3A-9D2E-4F5A6B7C8D9E", "", "acme-key"},
		{"a.b.c", strings.Repeat("t", 5000), ""},
		{"", "", "Bearer " + strings.Repeat("k", 5000)},
	} {
		f.Add(seed.seg, seed.tenant, seed.key)
	}
	fx := setupIDs(f)
	f.Fuzz(func(t *testing.T, seg, tenant, key string) {
		h := http.Header{}
		if tenant != "" {
			h.Set("X-Sluice-Tenant", tenant)
		}
		if key != "" {
			h.Set("Authorization", key)
		}
		rec := fx.get(url.PathEscape(seg), h)
		if rec.Code >= 500 {
			t.Fatalf("GET /v1/jobs/%q (tenant %q): %d %s", clip.String(seg, 40), clip.String(tenant, 40), rec.Code, rec.Body)
		}
		if nc := fx.mesh.JS.Conn(); !nc.IsConnected() {
			t.Fatalf("GET /v1/jobs/%q: NATS connection %v (%v)", clip.String(seg, 40), nc.Status(), nc.LastError())
		}
	})
}
