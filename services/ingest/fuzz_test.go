package ingest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzSubmitHeaders submits jobs with any value in each header and
// envelope field that reaches a NATS subject or KV key (the tenant through
// X-Sluice-Tenant and the API key, the priority, the job id, the
// idempotency key, the retry count, the deadline, the cost units): no
// answer is a server
// error, and the NATS connection stays up.
func FuzzSubmitHeaders(f *testing.F) {
	long := strings.Repeat("a", 5000)
	for _, s := range [][8]string{
		{"acme", "", "", "", "", "", "", ""},
		{"beta", "interactive", "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", "order-1", "0", "2030-01-01T00:00:00Z", "", "images=1"},
		{"acme.>", "*", long, long, "1", "x", "Bearer " + long, "a.b=1, *=2"},
		{long, "BATCH", "0190F6C4-8B1E-7C3A-9D2E-4F5A6B7C8D9E", "a.b.*", "-1", "", "Basic x", long + "=1"},
		{"*", ">", "..", "\x00", "99999999999999999999", "1e9", "", "images=99999999999999999999"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
	}
	fx := setup(f)
	mux := fx.mux()
	f.Fuzz(func(t *testing.T, tenant, priority, id, idemKey, retryCount, deadline, auth, cost string) {
		env, _ := json.Marshal(map[string]any{"id": id, "priority": priority, "request": json.RawMessage(chatHi)})
		headers := map[string]string{"Idempotency-Key": idemKey, "X-Stainless-Retry-Count": retryCount, "Authorization": auth,
			"X-Sluice-Priority": priority, "X-Sluice-Deadline": deadline, "X-Sluice-Wait-Timeout": "0.001", CostHeader: cost}
		for _, tc := range []struct{ path, body string }{{"/v1/jobs", string(env)}, {"/v1/chat/completions", chatHi}} {
			rec := post(mux, tc.path, tenant, tc.body, headers)
			if rec.Code >= 500 && rec.Code != http.StatusGatewayTimeout {
				t.Fatalf("POST %s: %d %s", tc.path, rec.Code, rec.Body)
			}
			if nc := fx.nc; !nc.IsConnected() {
				t.Fatalf("POST %s: NATS connection %v (%v)", tc.path, nc.Status(), nc.LastError())
			}
		}
	})
}

// FuzzResponseIDPath reads and deletes stored responses by any id (the
// path parameter of GET and DELETE /v1/responses/{id}, which becomes a
// results key): an id that is not resp_ and a canonical job id is a 404 in
// OpenAI's shape, never a server error, and the NATS connection stays up.
func FuzzResponseIDPath(f *testing.F) {
	for _, s := range []string{"resp_0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", "resp_", "resp_*", "resp_a.b.>", strings.Repeat("resp_x", 800), "%3E", "..",
		"resp_0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e/input_items"} {
		f.Add(s)
	}
	fx := setup(f)
	mux := fx.mux()
	f.Fuzz(func(t *testing.T, id string) {
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			req := httptest.NewRequest(method, "/v1/responses/x", nil)
			req.URL.Path = "/v1/responses/" + id
			req.URL.RawPath = ""
			req.Header.Set("X-Sluice-Tenant", "acme")
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s /v1/responses/%q: %d %s", method, id, rec.Code, rec.Body)
			}
			// (The mux redirects a path it cleans: nothing reaches NATS.)
			// (An id ending /input_items names that route, which has GET only.)
			other := rec.Code == http.StatusMethodNotAllowed && strings.HasSuffix(id, "/input_items")
			if responseJob(id) == "" && rec.Code != http.StatusNotFound && (rec.Code < 300 || rec.Code > 399) && !other {
				t.Fatalf("%s /v1/responses/%q: %d %s, want 404", method, id, rec.Code, rec.Body)
			}
			if nc := fx.nc; !nc.IsConnected() {
				t.Fatalf("%s /v1/responses/%q: NATS connection %v (%v)", method, id, nc.Status(), nc.LastError())
			}
		}
	})
}
