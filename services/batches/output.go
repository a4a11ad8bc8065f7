package batches

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// outcome is what became of one line.
type outcome struct {
	rec       *mesh.Record // its job's record (nil: none)
	ended     bool
	succeeded bool
	line      map[string]any // its output or error file line, once ended
}

// outcome reads line i's job (or its refusal) and renders its line.
func (d *driver) outcome(ctx context.Context, i int) (outcome, error) {
	id := d.jobs[i]
	line := map[string]any{"id": "batch_req_" + strings.ReplaceAll(id, "-", ""), "custom_id": nil, "response": nil, "error": nil}
	rec, _, err := d.mesh.LookupRecord(ctx, d.tenant, id)
	if errors.Is(err, job.ErrNotFound) {
		e, err := d.kv.Get(ctx, refusedKey(d.tenant, d.id, i+1))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			// Never submitted (or its record's retention ended).
			return outcome{ended: true, line: d.unsent(line)}, nil
		}
		if err != nil {
			return outcome{}, err
		}
		var rf refusal
		_ = json.Unmarshal(e.Value(), &rf)
		line["response"] = failedResponse(id, rf.Code, rf.Message)
		return outcome{ended: true, line: line}, nil
	}
	if err != nil {
		return outcome{}, err
	}
	res := rec.Result
	if res == nil {
		return outcome{rec: rec, line: line}, nil
	}
	o := outcome{rec: rec, ended: true, line: line}
	switch res.Status {
	case job.StatusSucceeded:
		o.succeeded = true
		line["response"] = map[string]any{"status_code": http.StatusOK, "request_id": id, "body": json.RawMessage(res.Response)}
	case job.StatusExpired:
		line["error"] = map[string]any{"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
	case job.StatusCancelled:
		line["error"] = map[string]any{"code": "batch_cancelled", "message": "This request was cancelled with its batch before it was sent."}
	default:
		code, msg := string(res.Status), "the request did not succeed"
		if res.Error != nil {
			code, msg = res.Error.Code, res.Error.Message
		}
		line["response"] = failedResponse(id, code, msg)
	}
	return o, nil
}

// unsent is the line of a request never submitted: its batch was
// cancelled, or its window ended, first.
func (d *driver) unsent(line map[string]any) map[string]any {
	if d.b.CancellingAt != 0 {
		line["error"] = map[string]any{"code": "batch_cancelled", "message": "This request was cancelled with its batch before it was sent."}
	} else {
		line["error"] = map[string]any{"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
	}
	return line
}

// failedResponse is the response of a request that failed with code.
func failedResponse(requestID, code, msg string) map[string]any {
	return map[string]any{"status_code": api.StatusFor(code), "request_id": requestID,
		"body": map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": code, "param": nil}}}
}

// finalize writes the batch's output file (the lines that succeeded) and
// error file (the others), in input order, and ends the batch: cancelled
// if it was asked to, expired if a line's window ended first, completed
// otherwise. Written again by a runner that takes a finalizing batch
// over, the files replace themselves (their ids derive from the batch's).
func (d *driver) finalize(ctx context.Context) error {
	customIDs, err := d.customIDs(ctx)
	if err != nil {
		return err
	}
	out, err := newSpool()
	if err != nil {
		return err
	}
	defer out.close()
	errs, err := newSpool()
	if err != nil {
		return err
	}
	defer errs.close()
	d.counts.completed, d.counts.failed = 0, 0
	expired := false
	for i := range d.jobs {
		o, err := d.outcome(ctx, i)
		if err != nil {
			return err
		}
		o.line["custom_id"] = customIDs[i]
		if e, ok := o.line["error"].(map[string]any); ok && e["code"] == "batch_expired" {
			expired = true
		}
		if o.succeeded {
			d.counts.completed++
			err = out.write(o.line)
		} else {
			d.counts.failed++
			err = errs.write(o.line)
		}
		if err != nil {
			return err
		}
	}
	outID, err := d.store(ctx, out, "output")
	if err != nil {
		return err
	}
	errID, err := d.store(ctx, errs, "error")
	if err != nil {
		return err
	}
	now := d.now().Unix()
	if _, err := d.update(ctx, func(b *batchRecord) {
		b.OutputFileID, b.ErrorFileID = outID, errID
		switch {
		case b.CancellingAt != 0:
			b.Status, b.CancelledAt = StatusCancelled, now
		case expired:
			b.Status, b.ExpiredAt = StatusExpired, now
		default:
			b.Status, b.CompletedAt = StatusCompleted, now
		}
		b.Owner, b.LeaseUntil = "", 0
	}); err != nil {
		return err
	}
	d.log.Info("batch ended", "batch_id", d.id, "tenant", d.tenant, "status", d.b.Status, "completed", d.counts.completed, "failed", d.counts.failed)
	return d.kv.Delete(ctx, openKey(d.tenant, d.id))
}

// customIDs reads the lines' custom ids, in order.
func (d *driver) customIDs(ctx context.Context) ([]string, error) {
	var ids []string
	_, err := readLines(ctx, d.files, d.tenant, d.b.InputFileID, d.app().Limits.MaxBodyBytes, func(_ int, in *inputLine, perr error) error {
		if perr != nil {
			return perr
		}
		ids = append(ids, in.CustomID)
		return nil
	})
	if err == nil && len(ids) != len(d.jobs) {
		err = fmt.Errorf("the input file changed: %d lines, was %d", len(ids), len(d.jobs))
	}
	return ids, err
}

// store makes a spool's lines the batch's file of kind (output, error);
// "" when it has none.
func (d *driver) store(ctx context.Context, s *spool, kind string) (string, error) {
	if s.n == 0 {
		return "", nil
	}
	if err := s.w.Flush(); err != nil {
		return "", err
	}
	if _, err := s.f.Seek(0, 0); err != nil {
		return "", err
	}
	rec := &fileRecord{ID: derivedFileID(d.id, kind), Tenant: d.tenant, CreatedAt: d.now().Unix(),
		Filename: d.id + "_" + kind + ".jsonl", Purpose: PurposeBatchOutput}
	if err := d.files.put(ctx, rec, s.f, 1<<40); err != nil {
		return "", err
	}
	return rec.ID, d.files.record(ctx, rec)
}

// spool is a file of JSON lines being written, on disk (an output file
// may be large).
type spool struct {
	f *os.File
	w *bufio.Writer
	n int
}

func newSpool() (*spool, error) {
	f, err := os.CreateTemp("", "sluice-batch-*.jsonl")
	if err != nil {
		return nil, err
	}
	return &spool{f: f, w: bufio.NewWriter(f)}, nil
}

func (s *spool) write(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.n++
	data = append(data, '\n')
	_, err = s.w.Write(data)
	return err
}

func (s *spool) close() {
	_ = s.f.Close()
	_ = os.Remove(s.f.Name())
}
