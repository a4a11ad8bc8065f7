package sim

import (
	"net/http"
	"strings"
)

// Under ProfileAzure the simulator is also an Azure OpenAI resource: each
// configured model is a deployment of that name, served at
//
//	POST /openai/deployments/{deployment}/chat/completions?api-version=V
//	POST /openai/deployments/{deployment}/embeddings?api-version=V
//
// with the key in the api-key header. A call there without api-version,
// to another operation, or without a valid api-key (a Bearer key does not
// count) is refused as Azure refuses it. The deployment in the URL, not the
// body's model, decides whose limits a call spends. OpenAI's paths stay
// served, with their Bearer key, so OpenAI-shaped clients can meet Azure's
// windows and headers.

// AzurePathPrefix starts every Azure call's path.
const AzurePathPrefix = "/openai/deployments/"

// serveAzure answers the calls on Azure's paths; it reports false for
// other paths.
func (s *Server) serveAzure(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, AzurePathPrefix)
	if !ok {
		return false
	}
	deployment, op, _ := strings.Cut(rest, "/")
	var parse func([]byte) (*call, error)
	switch op {
	case "chat/completions":
		parse = s.parseChat
	case "embeddings":
		parse = s.parseEmbeddings
	}
	if parse == nil || deployment == "" || r.URL.Query().Get("api-version") == "" {
		s.azureNotFound(w)
		return true
	}
	if s.allow(w, r, http.MethodPost) {
		s.serveCall(w, r, func(b []byte) (*call, error) {
			c, err := parse(b)
			if c != nil {
				c.model = deployment
			}
			return c, err
		})
	}
	return true
}

func (s *Server) azureNotFound(w http.ResponseWriter) {
	s.fail(w, s.gen.Load(), nil, http.StatusNotFound, apiError{Message: "Resource not found", Code: "404"})
}

// authorizeAzure checks the api-key header as authorize checks a Bearer
// key: always present, and one of Config.APIKeys when it names any.
func (s *Server) authorizeAzure(w http.ResponseWriter, g *generation, r *http.Request) (string, bool) {
	key := strings.TrimSpace(r.Header.Get("Api-Key"))
	if key != "" && (len(s.keys) == 0 || s.keys[key]) {
		return key, true
	}
	s.fail(w, g, nil, http.StatusUnauthorized, apiError{Code: "401",
		Message: "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."})
	return "", false
}
