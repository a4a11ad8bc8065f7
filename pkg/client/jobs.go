package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Jobs lists and cancels a tenant's jobs over Sluice's HTTP API (GET
// /v1/jobs, POST /v1/jobs/{id}/cancel), as the tenant whose API key it
// holds: a tenant's NATS connection may not read other jobs' records.
//
//	jobs := client.NewJobs("http://127.0.0.1:8080", os.Getenv("ACME_SLUICE_KEY"))
//	page, err := jobs.List(ctx, client.ListOptions{Status: job.StatusQueued})
type Jobs struct {
	BaseURL string       // the API's base URL, without /v1
	APIKey  string       // the tenant's key
	HTTP    *http.Client // nil: http.DefaultClient
}

// NewJobs returns a Jobs for the API at baseURL with the tenant's apiKey.
func NewJobs(baseURL, apiKey string) *Jobs {
	return &Jobs{BaseURL: strings.TrimSuffix(baseURL, "/"), APIKey: apiKey}
}

// ListOptions filter and page a listing; zero values are the API's
// defaults (every status, 20 jobs, from the newest).
type ListOptions struct {
	Status job.Status
	Limit  int
	After  string // the previous page's LastID
}

// APIError is an answer other than 2xx: its status and the API's error.
type APIError struct {
	StatusCode int
	Code       string
	Message    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("sluice: %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// List returns one page of the tenant's jobs, newest first.
func (c *Jobs) List(ctx context.Context, o ListOptions) (*job.List, error) {
	q := url.Values{}
	if o.Status != "" {
		q.Set("status", string(o.Status))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.After != "" {
		q.Set("after", o.After)
	}
	var out job.List
	_, err := c.do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), &out)
	return &out, err
}

// Cancel cancels a job: a queued one ends cancelled; a running one is
// stopped when its call allows (a streamed call), else the answer is an
// *APIError with StatusCode 409 and Code "job_running"; a finished one is
// a 409 "job_finished". accepted says the stop was asked for and the job
// has not ended yet.
func (c *Jobs) Cancel(ctx context.Context, id string) (s *job.Summary, accepted bool, err error) {
	var out job.Summary
	status, err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", &out)
	return &out, status == http.StatusAccepted, err
}

func (c *Jobs) do(ctx context.Context, method, path string, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal(body, &e)
		return resp.StatusCode, &APIError{StatusCode: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	return resp.StatusCode, json.Unmarshal(body, out)
}
