package ingest

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Model is one entry of GET /v1/models: OpenAI's model object. The id is
// the name callers send as "model"; owned_by is the provider that serves it.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// modelsAPI is GET /v1/models and /v1/models/{id}: the configured models
// as OpenAI lists them (created: when the process started).
type modelsAPI struct {
	*deps
	created int64
}

func modelObject(p *config.Provider, m *config.Model, created int64) Model {
	return Model{ID: m.Name, Object: "model", Created: created, OwnedBy: p.Name}
}

// GET /v1/models: every configured model once, a group of deployments
// under its preferred provider.
func (s *modelsAPI) listModels(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	if _, err := auth.Tenant(r); err != nil {
		s.fail(w, "openai", err)
		return
	}
	data := []Model{}
	seen := map[string]bool{}
	app := s.app()
	for i := range app.Providers {
		p := &app.Providers[i]
		for j := range p.Models {
			if name := p.Models[j].Name; !seen[name] && api.ModelAllowed(r.Context(), name) {
				seen[name] = true
				gp, gm, _ := app.ModelRef(name)
				data = append(data, modelObject(gp, gm, s.created))
			}
		}
	}
	api.JSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// GET /v1/models/{id}: one model, or 404 model_not_found.
func (s *modelsAPI) getModel(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	if _, err := auth.Tenant(r); err != nil {
		s.fail(w, "openai", err)
		return
	}
	id := r.PathValue("id")
	p, m, ok := s.app().ModelRef(id)
	if !ok || !api.ModelAllowed(r.Context(), m.Name) {
		api.ErrorParam(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			fmt.Sprintf("The model %q is not configured in Sluice", clip.String(id, 64)))
		return
	}
	api.JSON(w, http.StatusOK, modelObject(p, m, s.created))
}

// endpointServed refuses a job its provider has no API for: Anthropic has
// no embeddings, and its Messages API no n (Sluice does not fan a request
// out into n calls: n > 1 would be n reservations and n bills for what the
// caller sees as one call).
func endpointServed(j *task.Task, p *config.Provider) error {
	if p.Kind != "anthropic" {
		return nil
	}
	if j.Endpoint == job.EndpointEmbeddings {
		return &job.ValidationError{Code: job.CodeUnsupported, Field: "request.model",
			Message: fmt.Sprintf("is served by provider %q (Anthropic), which has no embeddings API; use a model of an OpenAI-compatible provider", p.Name)}
	}
	var v struct {
		N *int `json:"n"`
	}
	if json.Unmarshal(j.Request, &v) == nil && v.N != nil && *v.N > 1 {
		return &job.ValidationError{Code: job.CodeUnsupported, Field: "request.n",
			Message: fmt.Sprintf("must be 1: the model is served by provider %q (Anthropic), whose Messages API returns one completion per call; send n separate requests", p.Name)}
	}
	return nil
}
