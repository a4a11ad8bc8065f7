package ingest

import (
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A model name served by several providers is a group of deployments
// (internal/config). Ingest checks a job against its group and stamps
// it with the deployment it starts on: the one its producer pinned (the
// envelope's provider, the X-Sluice-Provider header), else the group's
// preferred one; admission places an unpinned job on whichever deployment
// of the group can send it first.

// deployment resolves the deployment a job of model name starts on; pin
// is the provider its producer named ("" for none).
func (s *acceptor) deployment(j *task.Task, name, pin string) (*config.Provider, *config.Model, error) {
	p, m, ok := s.app().ModelRef(name)
	if !ok {
		return nil, nil, &job.ValidationError{Code: job.CodeUnknownModel, Field: "request.model", Message: fmt.Sprintf("model %q is not configured", clip.String(name, 64))}
	}
	if pin == "" {
		return p, m, nil
	}
	if p, m, ok = s.app().Deployment(pin, name); !ok {
		return nil, nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "provider",
			Message: fmt.Sprintf("provider %q serves no deployment of model %q", clip.String(pin, 64), clip.String(name, 64))}
	}
	j.Pinned = true
	return p, m, nil
}

// fitsGroup is fits against the job's deployment or, for an unpinned job
// it does not fit, against any other deployment of the group (admission
// places the job only where it fits).
func (s *acceptor) fitsGroup(j *task.Task, model *config.Model, est *job.Estimate) error {
	err := s.fits(j, model, est)
	if err == nil || j.Pinned || !s.app().Grouped(model.Name) {
		return err
	}
	for _, d := range s.app().Group(model.Name) {
		if d.Model != model && s.fits(j, d.Model, est) == nil {
			return nil
		}
	}
	return err
}

// capacity is the model whose limits a job's wait is estimated at: its
// pinned deployment's, else its group's together (0, no limit, where any
// deployment has none).
func (s *acceptor) capacity(j *task.Task, model *config.Model) *config.Model {
	if j.Pinned || !s.app().Grouped(model.Name) {
		return model
	}
	sum := *model
	sum.RPM, sum.TPM = 0, 0
	rpm, tpm := true, true
	for _, d := range s.app().Group(model.Name) {
		rpm, tpm = rpm && d.Model.RPM > 0, tpm && d.Model.TPM > 0
		sum.RPM += d.Model.RPM
		sum.TPM += d.Model.TPM
	}
	if !rpm {
		sum.RPM = 0
	}
	if !tpm {
		sum.TPM = 0
	}
	return &sum
}

// affinity fills a grouped job's affinity key, when its producer gave
// none, from the request's prompt_cache_key or user: the conversation
// whose prefix a deployment's cache holds.
func (s *acceptor) affinity(j *task.Task, name string) {
	if j.Affinity != "" || j.Endpoint == job.EndpointEmbeddings || !s.app().Grouped(name) {
		return
	}
	var v struct {
		PromptCacheKey string `json:"prompt_cache_key"`
		User           string `json:"user"`
	}
	if json.Unmarshal(j.Request, &v) != nil {
		return
	}
	for _, k := range []string{v.PromptCacheKey, v.User} {
		if k != "" && len(k) <= job.MaxAffinity {
			j.Affinity = k
			return
		}
	}
}
