package ingest

import (
	"context"
	"net/http"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/pkg/job"
)

type endpointKey struct{}

// withEndpoint marks a request's context with the provider API its body is
// for; chat reads it (endpointOf) so every submit-and-wait endpoint shares
// one handler.
func withEndpoint(ctx context.Context, endpoint string) context.Context {
	return context.WithValue(ctx, endpointKey{}, endpoint)
}

// endpointOf is the endpoint withEndpoint set, or "" (chat completions).
func endpointOf(ctx context.Context) string {
	e, _ := ctx.Value(endpointKey{}).(string)
	return e
}

// POST /v1/embeddings: OpenAI-compatible, through the same queue, admission
// and executor path as chat. The job is charged its input tokens, counted
// with the model's tokenizer; an array input is one request (one provider
// call, up to job.MaxEmbeddingInputs inputs), as OpenAI's API takes it.
// Headers and errors are as for chat completions.
func (s *Service) embeddings(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	s.chat(w, r.WithContext(withEndpoint(r.Context(), job.EndpointEmbeddings)), auth)
}
