// Package provider calls LLM providers over plain net/http and decides what
// each outcome means for the executor.
//
// # Clients
//
// [OpenAI] speaks any OpenAI-compatible chat-completions API and forwards the
// job's body untouched; a job that came in on /v1/responses goes to a
// provider serving the Responses API natively as a Responses request
// (OpenAIConfig.Responses). [Anthropic] speaks the Messages API. Where the
// wire format differs, package wire translates the body on the way out and
// the answer back to an OpenAI chat.completion, so the executor only ever
// sees OpenAI shapes. Both parse token usage and rate-limit headers into the
// [Response]. Nothing here logs, and no error carries a prompt or a key.
//
// # Batches
//
// [BatchClient] speaks the providers' Batch APIs with a synchronous
// client's configuration ([BatchesOf]): OpenAI's files and batches, Azure's
// global batch at its own paths, Anthropic's Message Batches. Results come
// back by custom id, an errored line classified as the same answer to a
// synchronous call; [CancelAndWait] returns once a cancellation has
// finished, so no line is answered twice. [ErrEnqueuedTokenLimit],
// [ErrBatchQueueFull] and [ErrBatchTooLarge] name the batch limits.
//
// # One call, one attempt
//
// A Client never retries, and neither does the HTTP stack under it: Go's
// http.Transport silently replays a request on a reused connection when the
// request is "replayable" — it can rewind the body (GetBody) and is
// idempotent or carries an Idempotency-Key header, which we send. A replay is
// a second, billed provider call nobody hears of, so requests are built with
// GetBody nil (see send). Retrying is the executor's decision, made with
// [Classify] and [Plan].
//
// # Where a call failed
//
// A failed call is a [*TransportError] whose [Phase] says what the provider
// may have done:
//
//   - [PhaseConnect]: dial, TLS, connect timeout, or the connection broke
//     before one byte of the request was written. Never left: safe to retry.
//   - [PhaseAwaitHeaders]: sent, but no headers came back (header timeout,
//     reset, EOF). The outcome is unknown: the provider may have done it.
//   - [PhaseBody]: the body was cut. The provider almost surely did the work.
//   - [PhaseBuild]: the request could not be built; nothing was sent.
//
// The built-in transport wraps every connection to count writes, so "nothing
// was written" is exact; it speaks HTTP/1.1 only (one request per connection
// at a time), which keeps that count per request. With a caller-supplied
// Transport the phase falls back to httptrace events, and to
// PhaseAwaitHeaders when the transport reports none. When the caller's
// context ends the call, errors.Is(err, context.Canceled) (or
// DeadlineExceeded) holds, and the phase still says how far it got.
//
// # Classification
//
// [Rules] is the whole classification table, in one place: transport phases,
// HTTP statuses and the error type/code/message of OpenAI and Anthropic error
// bodies, matched first-row-wins. [ClassTable] renders it as Markdown for
// docs/OPERATIONS.md. [Classify] turns a (Response, error) pair into an [Outcome]: a
// [Class] (whose String is the error_type metric label), the provider's error
// code and message, Retry-After, which limit was hit, and whether the
// provider certainly did not, may have, or surely did process the request.
//
// # Retries
//
// [ParseRetryAfter], [Backoff] (exponential, full jitter, never below
// Retry-After) and [Plan] are pure functions. Plan retries only throttling,
// overload and connect failures, never cuts a Retry-After short, and never
// returns a delay that passes the job's deadline or the policy's elapsed
// budget; an unknown outcome is handed back to the caller's reconciliation
// policy.
package provider
