package bench

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// waitLog reads the queue waits of finished jobs from the request log
// (the result service's "job finished" lines, docs/OPERATIONS.md): job_id
// and queue_wait_ms, absent when the wait was under a millisecond.
type waitLog struct {
	mu    sync.Mutex
	waits map[string]time.Duration
	// logged is closed, and replaced, at each line read.
	logged chan struct{}
}

func newWaitLog() *waitLog {
	return &waitLog{waits: map[string]time.Duration{}, logged: make(chan struct{})}
}

// await returns when the lines of every job in ids have been read, or ctx
// ends: a result reaches its subscribers before its line is written.
func (w *waitLog) await(ctx context.Context, ids []string) {
	for {
		w.mu.Lock()
		missing := slices.ContainsFunc(ids, func(id string) bool { _, ok := w.waits[id]; return !ok })
		logged := w.logged
		w.mu.Unlock()
		if !missing {
			return
		}
		select {
		case <-logged:
		case <-ctx.Done():
			return
		}
	}
}

// wait is the queue wait logged for job id, and whether its line was.
func (w *waitLog) wait(id string) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d, ok := w.waits[id]
	return d, ok
}

// handler is a slog.Handler that records the request log's queue waits
// and hands every record inner takes on to it.
func (w *waitLog) handler(inner slog.Handler) slog.Handler { return &waitHandler{log: w, inner: inner} }

type waitHandler struct {
	log   *waitLog
	inner slog.Handler
}

func (h *waitHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.inner.Enabled(ctx, l)
}

func (h *waitHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "job finished" {
		var id string
		var wait time.Duration
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "job_id":
				id = a.Value.String()
			case "queue_wait_ms":
				if a.Value.Kind() == slog.KindInt64 {
					wait = time.Duration(a.Value.Int64()) * time.Millisecond
				}
			}
			return true
		})
		if id != "" {
			h.log.mu.Lock()
			h.log.waits[id] = wait
			close(h.log.logged)
			h.log.logged = make(chan struct{})
			h.log.mu.Unlock()
		}
	}
	if !h.inner.Enabled(ctx, r.Level) {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h *waitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &waitHandler{log: h.log, inner: h.inner.WithAttrs(as)}
}

func (h *waitHandler) WithGroup(name string) slog.Handler {
	return &waitHandler{log: h.log, inner: h.inner.WithGroup(name)}
}
