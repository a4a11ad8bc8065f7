package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
)

// baseURLWarnings are base_url values that parse but likely miss the API's
// version path: the clients call base_url + "/chat/completions" (OpenAI)
// or + "/messages" (Anthropic), and the providers serve those under /v1.
func baseURLWarnings(c *config.Config) []string {
	var out []string
	for i, p := range c.Providers {
		if p.Kind == config.KindAzure || p.BaseURL == "" {
			continue
		}
		u, err := url.Parse(p.BaseURL)
		if err != nil {
			continue
		}
		if !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") {
			out = append(out, fmt.Sprintf("providers[%d].base_url: %q does not end in /v1; calls go to %s/%s (most providers want .../v1; check with --probe)",
				i, p.BaseURL, strings.TrimSuffix(p.BaseURL, "/"), map[bool]string{true: "messages", false: "chat/completions"}[p.Kind == "anthropic"]))
		}
	}
	return out
}

// probe makes one cheap authenticated call per provider (its model list)
// and reports each deployment: whether the key was taken and the model is
// listed. The result is false when one failed.
func probe(ctx context.Context, w io.Writer, c *config.Config, getenv func(string) string) bool {
	ok := true
	client := &http.Client{Timeout: 10 * time.Second}
	for i, p := range c.Providers {
		listed, err := probeProvider(ctx, client, p, getenv)
		for _, m := range p.Models {
			name := m.Upstream
			if name == "" {
				name = m.Name
			}
			switch {
			case err != nil:
				ok = false
				fmt.Fprintf(w, "  probe     providers[%d] %s / %s: %v\n", i, p.Name, m.Name, err)
			case listed != nil && !slices.Contains(listed, name):
				fmt.Fprintf(w, "  probe     providers[%d] %s / %s: key accepted; %q is not in the provider's model list\n", i, p.Name, m.Name, name)
			default:
				fmt.Fprintf(w, "  probe     providers[%d] %s / %s: ok\n", i, p.Name, m.Name)
			}
		}
	}
	return ok
}

// probeProvider lists p's models with its key; nil models: the answer
// listed none that could be read.
func probeProvider(ctx context.Context, client *http.Client, p config.Provider, getenv func(string) string) ([]string, error) {
	key := ""
	if p.APIKeyEnv != "" {
		key = strings.TrimSpace(getenv(p.APIKeyEnv))
	}
	base := strings.TrimSuffix(p.BaseURL, "/")
	target := base + "/models"
	switch p.Kind {
	case "anthropic":
		if base == "" {
			target = provider.DefaultAnthropicBaseURL + "/models"
		}
	case config.KindAzure:
		v := p.APIVersion
		if v == "" {
			v = provider.DefaultAzureAPIVersion
		}
		target = base + "/openai/models?api-version=" + url.QueryEscape(v)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, fmt.Errorf("base_url: %w", err)
	}
	switch p.Kind {
	case "anthropic":
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", "2023-06-01")
	case config.KindAzure:
		req.Header.Set("api-key", key)
	default:
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, fmt.Errorf("GET %s: %s: the provider refused the key in %s", target, resp.Status, p.APIKeyEnv)
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("GET %s: 404: nothing there; is base_url right (…/v1)?", target)
	case resp.StatusCode >= 300:
		return nil, fmt.Errorf("GET %s: %s", target, resp.Status)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &list) != nil || len(list.Data) == 0 {
		return nil, nil
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	return ids, nil
}
