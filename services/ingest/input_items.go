package ingest

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// GET /v1/responses/{id}/input_items: a stored response's input items as
// OpenAI lists them, a page at a time (limit 1-100, default 20; order
// desc, the default, or asc; after and before an item id). The input is
// the whole conversation the response answered: a chained response's
// list holds the earlier turns' input and output too.
func (s responsesSurface) inputItems(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "responses", err)
		return
	}
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, "limit", "limit must be an integer from 1 to 100")
			return
		}
		limit = n
	}
	order := q.Get("order")
	if order == "" {
		order = "desc"
	}
	if order != "asc" && order != "desc" {
		api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, "order", "order must be asc or desc")
		return
	}
	st, _, err := s.loadResponse(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		s.notFoundOr(w, err)
		return
	}
	raws := st.items()
	items := make([]map[string]any, 0, len(raws))
	for i, raw := range raws {
		it, err := wire.ListItem(raw, i)
		if err != nil {
			continue
		}
		items = append(items, it)
	}
	if order == "desc" {
		slices.Reverse(items)
	}
	// after and before are ids of the list in this order.
	if id := q.Get("after"); id != "" {
		items = items[cursor(items, id)+1:]
	}
	if id := q.Get("before"); id != "" {
		if k := cursor(items, id); k >= 0 {
			items = items[:k]
		}
	}
	more := len(items) > limit
	if more {
		items = items[:limit]
	}
	out := map[string]any{"object": "list", "data": items, "has_more": more, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		out["first_id"], out["last_id"] = items[0]["id"], items[len(items)-1]["id"]
	}
	api.JSON(w, http.StatusOK, out)
}

// cursor is the index of the item with id, or -1.
func cursor(items []map[string]any, id string) int {
	return slices.IndexFunc(items, func(it map[string]any) bool { return it["id"] == id })
}
