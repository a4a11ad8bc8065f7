package provider

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// An Azure call goes to its deployment (the call's model, else the body's)
// with the api-version and the api-key header, and a short window's
// x-ratelimit-limit-* (with the remaining counts beside them) is never
// read as a minute's.
func TestAzureCall(t *testing.T) {
	t.Parallel()
	var uri, key, bearer string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uri, key, bearer = r.URL.RequestURI(), r.Header.Get("api-key"), r.Header.Get("Authorization")
		w.Header().Set("x-ratelimit-limit-requests", "20")
		w.Header().Set("x-ratelimit-remaining-requests", "3")
		w.Header().Set("retry-after-ms", "250")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
	}))
	defer srv.Close()
	az := NewAzure(AzureConfig{BaseURL: srv.URL + "/", APIKey: "secret"})
	for _, tc := range []struct {
		call Call
		want string
	}{
		{Call{Model: "gpt-4o-mini-2024-07-18", Body: []byte(`{"model":"gpt-4o-mini"}`)}, "/openai/deployments/gpt-4o-mini-2024-07-18/chat/completions?api-version=" + DefaultAzureAPIVersion},
		{Call{Body: []byte(`{"model":"a b"}`), Endpoint: "embeddings"}, "/openai/deployments/a%20b/embeddings?api-version=" + DefaultAzureAPIVersion},
	} {
		resp, err := az.Do(context.Background(), tc.call)
		if err != nil {
			t.Fatal(err)
		}
		if uri != tc.want || key != "secret" || bearer != "" {
			t.Errorf("got %s with api-key %q, Authorization %q; want %s with the key in api-key only", uri, key, bearer, tc.want)
		}
		if rl := resp.RateLimit; rl.LimitRequests != -1 || rl.RemainingRequests != -1 {
			t.Errorf("rate limit %+v: want the 10-s window's figures dropped", rl)
		}
		if resp.Header.Get("X-Ratelimit-Limit-Requests") != "" || resp.Header.Get("Retry-After-Ms") != "250" {
			t.Errorf("headers %v: want the short window's limit dropped and retry-after-ms kept", resp.Header)
		}
	}
	if _, err := NewAzure(AzureConfig{BaseURL: srv.URL}).Do(context.Background(), Call{Body: []byte(`{}`)}); err == nil {
		t.Error("a call naming no deployment: want an error")
	}
}
