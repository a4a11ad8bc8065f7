package sim_test

import (
	"net/http"
	"testing"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// Under the azure profile the simulator answers Azure's URLs with the
// api-key header, refuses other shapes there, and lets the deployment in
// the URL decide whose limits a call spends.
func TestAzureAPI(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600}, {Name: "other", RPM: 600}},
		Profile: sim.ProfileAzure, APIKeys: []string{"k"}})
	b := body("other", "hi", 10) // the URL's deployment wins over the body's model
	deployment := url + sim.AzurePathPrefix + model
	for _, tc := range []struct {
		name, url string
		hdr       []string
		want      int
	}{
		{"OpenAI's path, Azure's header", url + "/v1/chat/completions", []string{"api-key", "k"}, http.StatusUnauthorized},
		{"no api-version", deployment + "/chat/completions", []string{"api-key", "k"}, http.StatusNotFound},
		{"unknown operation", deployment + "/completions?api-version=2024-10-21", []string{"api-key", "k"}, http.StatusNotFound},
		{"a Bearer key", deployment + "/chat/completions?api-version=2024-10-21", []string{"Authorization", "Bearer k"}, http.StatusUnauthorized},
		{"a wrong key", deployment + "/chat/completions?api-version=2024-10-21", []string{"api-key", "nope"}, http.StatusUnauthorized},
		{"unknown deployment", url + sim.AzurePathPrefix + "nope/chat/completions?api-version=2024-10-21", []string{"api-key", "k"}, http.StatusNotFound},
		{"chat", deployment + "/chat/completions?api-version=2024-10-21", []string{"api-key", "k"}, http.StatusOK},
		{"embeddings", deployment + "/embeddings?api-version=2024-10-21", []string{"api-key", "k"}, http.StatusOK},
	} {
		payload := b
		if tc.name == "embeddings" {
			payload = `{"model":"x","input":"hello"}`
		}
		r := do(t, http.MethodPost, tc.url, payload, tc.hdr...)
		if r.status != tc.want {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.status, tc.want, r.body)
		}
	}
	st := s.Stats()
	if got := st.Models[model].Requests[http.StatusOK]; got != 2 {
		t.Errorf("%s served %d calls, want 2 (chat and embeddings)", model, got)
	}
	// OpenAI's shape is served too, with a Bearer key.
	if r := chat(t, url, body(model, "hi", 10), "Authorization", "Bearer k"); r.status != http.StatusOK {
		t.Errorf("OpenAI's path: status %d", r.status)
	}
	if got := st.Models["other"].Requests[http.StatusOK]; got != 0 {
		t.Errorf("the body's model served %d calls, want 0", got)
	}
}
