package provider

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A provider that serves the Responses API (OpenAIConfig.Responses) is
// called there for a job that came in on /v1/responses: the job's chat
// body is translated back to a Responses request and the answer to chat,
// so the executor handles it as any chat call (internal/wire).

// doResponses POSTs a call to {BaseURL}/responses.
func (o *OpenAI) doResponses(ctx context.Context, c Call) (*Response, error) {
	ctx = withSendBy(ctx, c)
	target, err := endpoint(o.baseURL, "/responses")
	if err != nil {
		return nil, buildErr("%v", err)
	}
	body, err := wire.ChatToResponses(c.Body)
	if err != nil {
		return nil, buildErr("converting request for the Responses API: %v", err)
	}
	status, hdr, resp, err := send(ctx, o.rt, target, body, o.header(c), o.maxResp)
	if err != nil {
		return nil, err
	}
	r := &Response{Status: status, Header: hdr, Body: resp, RateLimit: ParseRateLimit(hdr, time.Now())}
	if status >= 200 && status < 300 {
		if conv, err := wire.ResponseToChat(resp); err == nil {
			r.Body = conv
		}
		r.Usage, r.Answer = ParseAnswer(r.Body)
	}
	return r, nil
}

// streamResponses streams a call from {BaseURL}/responses, its typed
// events translated to chat chunks.
func (o *OpenAI) streamResponses(ctx context.Context, c Call) (*Response, *Stream, error) {
	ctx = withSendBy(ctx, c)
	target, err := endpoint(o.baseURL, "/responses")
	if err != nil {
		return nil, nil, buildErr("%v", err)
	}
	body, err := wire.ChatToResponses(c.Body)
	if err != nil {
		return nil, nil, buildErr("converting request for the Responses API: %v", err)
	}
	ns := wire.NewNativeStream(time.Now().Unix())
	conv := func(ev ssestream.Event) ([][]byte, bool, error) {
		chunks, done, err := ns.Event(ev.Data)
		var failed *wire.ErrStreamFailed
		if errors.As(err, &failed) {
			return chunks, done, &StreamError{Body: failed.Body}
		}
		return chunks, done, err
	}
	whole := func(b []byte) [][]byte {
		conv, err := wire.ResponseToChat(b)
		if err != nil {
			return nil
		}
		return raw(job.CompletionChunks(conv, true))
	}
	return openStream(ctx, o.rt, target, body, o.header(c), o.maxResp, conv, whole)
}

func (o *OpenAI) header(c Call) http.Header {
	h := baseHeader(c)
	if o.apiKey != "" {
		h.Set("Authorization", "Bearer "+o.apiKey)
	}
	return h
}

// forChat is the body a Responses job is sent on Chat Completions (the
// caller's built-in tools refused, its reasoning items dropped: package
// wire); any other job's body is sent untouched.
func forChat(c Call) ([]byte, error) {
	if c.Endpoint != job.EndpointResponses {
		return c.Body, nil
	}
	b, err := wire.ForChat(c.Body)
	if err != nil {
		return nil, buildErr("%v", err)
	}
	return b, nil
}
