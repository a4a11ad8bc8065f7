package api

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Error codes of the HTTP API beyond the job's own (job.Code*).
const (
	// CodeUnsupportedMediaType refuses a body not declared
	// application/json (415).
	CodeUnsupportedMediaType = "unsupported_media_type"
)

// ErrorParam writes an OpenAI-shaped error body whose param names the field
// at fault ("" writes null, as Error does).
func ErrorParam(w http.ResponseWriter, status int, typ, code, param, msg string) {
	var p any
	if param != "" {
		p = param
	}
	JSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code, "param": p}})
}

// Param turns a job field path into the request parameter OpenAI's param
// names: "request.max_tokens" → "max_tokens"; header names and envelope
// fields ("deadline") are kept as they are.
func Param(field string) string {
	if p, ok := strings.CutPrefix(field, "request."); ok {
		return p
	}
	return field
}

// methods are the methods the catch-all probes to tell a wrong method (405)
// from an unknown path (404).
var methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// NotFound is the catch-all handler for mux ("/"): an unknown path answers
// 404 and a known path asked with the wrong method 405 with Allow, both in
// OpenAI's error shape, as the provider APIs do. ServeMux sends a request
// here whenever no other pattern matches, wrong methods included (a "/"
// pattern matches every method), so the methods a path does serve are found
// by asking mux.
func NotFound(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range methods {
			if m == r.Method {
				continue
			}
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			slices.Sort(allow)
			w.Header().Set("Allow", strings.Join(allow, ", "))
			Error(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
				fmt.Sprintf("%s is not allowed on %s; use %s", r.Method, r.URL.Path, strings.Join(allow, " or ")))
			return
		}
		Error(w, http.StatusNotFound, "invalid_request_error", "unknown_url",
			fmt.Sprintf("unknown request URL: %s %s", r.Method, r.URL.Path))
	})
}
