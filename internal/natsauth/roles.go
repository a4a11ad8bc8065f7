// Package natsauth decides who may do what on Sluice's NATS: the accounts
// (the services' and one per tenant, see accounts.go); the permissions of
// each service role, of the operator and of each tenant; the service
// identities (nkeys) kept in the data directory; the accounts and users of
// the embedded server; the nats-server accounts block for an external
// cluster; and how a process or CLI command connects.
//
// A process connects once, as the union of the roles of the services it
// runs ("ingest-result" for `--services ingest,result`). The embedded server
// knows every union of the four service roles, so any process joining it
// with the same data directory finds an identity that fits.
package natsauth

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/lane"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Roles.
const (
	Ingest    = "ingest"
	Admission = "admission"
	Executor  = "executor"
	Result    = "result"
	// Operator is the CLI (queue, dlq, submit) and stream management:
	// everything in JetStream and on Sluice's subjects.
	Operator = "operator"
)

// ServiceRoles are the roles of the four services, in canonical order.
var ServiceRoles = []string{Ingest, Admission, Executor, Result}

// SetName is the canonical name of a set of roles: the roles in
// ServiceRoles order joined by "-" ("ingest-result"), or "operator".
func SetName(roles []string) string {
	if slices.Contains(roles, Operator) {
		return Operator
	}
	var out []string
	for _, r := range ServiceRoles {
		if slices.Contains(roles, r) {
			out = append(out, r)
		}
	}
	return strings.Join(out, "-")
}

// ParseSet is the inverse of SetName.
func ParseSet(name string) ([]string, error) {
	if name == Operator {
		return []string{Operator}, nil
	}
	var roles []string
	for _, r := range strings.Split(name, "-") {
		if !slices.Contains(ServiceRoles, r) {
			return nil, fmt.Errorf("unknown role %q (want operator, or some of %s)", r, strings.Join(ServiceRoles, ","))
		}
		roles = append(roles, r)
	}
	if SetName(roles) != name {
		return nil, fmt.Errorf("role set %q: write it as %q", name, SetName(roles))
	}
	return roles, nil
}

// AllSets are every non-empty union of the service roles, and the operator.
func AllSets() []string {
	var out []string
	n := len(ServiceRoles)
	for mask := 1; mask < 1<<n; mask++ {
		var roles []string
		for i, r := range ServiceRoles {
			if mask&(1<<i) != 0 {
				roles = append(roles, r)
			}
		}
		out = append(out, SetName(roles))
	}
	return append(out, Operator)
}

// ServiceInboxPrefix is the reply-inbox prefix of a role set: each identity
// reads only its own replies.
func ServiceInboxPrefix(set string) string { return mesh.ServiceInboxRoot + set }

// perms collects allow lists.
type perms struct {
	pub, sub  []string
	responses bool
}

func (p *perms) add(o perms) {
	p.pub = append(p.pub, o.pub...)
	p.sub = append(p.sub, o.sub...)
	p.responses = p.responses || o.responses
}

const api = "$JS.API."

// consumer is what a service needs to create and pull from its durable
// consumer(s) on a stream: name may be "*" (the executor's, one per model).
func consumer(stream, name string, filtered bool) perms {
	create := api + "CONSUMER.CREATE." + stream + "." + name
	if filtered {
		create += ".>"
	}
	return perms{pub: []string{create,
		api + "CONSUMER.INFO." + stream + "." + name,
		api + "CONSUMER.MSG.NEXT." + stream + "." + name,
		"$JS.ACK." + stream + "." + name + ".>"}}
}

// streamRead reads single messages of a stream (by sequence or subject).
func streamRead(stream string) perms {
	return perms{pub: []string{api + "STREAM.MSG.GET." + stream, api + "DIRECT.GET." + stream, api + "DIRECT.GET." + stream + ".>"}}
}

// follow reads streamed jobs' chunks from STREAMS with ephemeral ordered
// consumers (client.Follow), whose names the client library makes up.
func follow() perms {
	p := streamRead(streams.StreamChunks)
	p.pub = append(p.pub,
		api+"CONSUMER.CREATE."+streams.StreamChunks+".>",
		api+"CONSUMER.MSG.NEXT."+streams.StreamChunks+".*",
		api+"CONSUMER.INFO."+streams.StreamChunks+".*",
		api+"CONSUMER.DELETE."+streams.StreamChunks+".*")
	return p
}

func kvRead(bucket string) perms { return streamRead("KV_" + bucket) }

func kvWrite(bucket string) perms {
	p := kvRead(bucket)
	p.pub = append(p.pub, "$KV."+bucket+".>")
	return p
}

// kvWatch watches a bucket's keys under prefix (internal/health): an
// ordered push consumer the client library names and deletes, with flow
// control, delivering to the identity's own inbox.
func kvWatch(bucket, prefix string) perms {
	stream := "KV_" + bucket
	return perms{pub: []string{
		api + "CONSUMER.CREATE." + stream + ".*.$KV." + bucket + "." + prefix + ">",
		api + "CONSUMER.DELETE." + stream + ".*",
		"$JS.FC." + stream + ".>"}}
}

// objectStore reads and writes an object store's objects: its chunks and
// metadata, purging an object's chunks, and reading them back with an
// ordered push consumer the client library names and deletes.
func objectStore(bucket string) perms {
	stream := "OBJ_" + bucket
	p := streamRead(stream)
	p.pub = append(p.pub, "$O."+bucket+".>", api+"STREAM.PURGE."+stream,
		api+"CONSUMER.CREATE."+stream+".*.$O."+bucket+".C.*",
		api+"CONSUMER.DELETE."+stream+".*",
		"$JS.FC."+stream+".>")
	return p
}

// info lets every service look up every stream and bucket (configuration
// and counts, no messages): binding a bucket or stream reads its info.
func info() perms {
	var p perms
	for _, s := range []string{streams.Intake, streams.Queue, streams.Dispatch, streams.Results, streams.DLQ, streams.StreamChunks, streams.Lane,
		"KV_" + streams.BucketBudgets, "KV_" + streams.BucketIdempotency, "KV_" + streams.BucketResults, "KV_" + streams.BucketFleet,
		"KV_" + streams.BucketCache, "KV_" + streams.BucketBatches, "OBJ_" + streams.ObjectFiles} {
		p.pub = append(p.pub, api+"STREAM.INFO."+s)
	}
	return p
}

// rolePerms is what each role needs, read from the services' code: keep it
// in step with services/*, internal/mesh, internal/dlq, internal/budget,
// internal/adapt and internal/calib (the end-to-end tests run every service
// under these permissions and fail on a violation).
func rolePerms(role string) perms {
	var p perms
	switch role {
	case Ingest:
		p.add(consumer(streams.Intake, "ingest", false))
		p.add(kvWrite(streams.BucketResults))
		p.add(kvWrite(streams.BucketIdempotency))
		p.add(kvRead(streams.BucketBudgets)) // estimate calibration
		p.add(kvRead(streams.BucketFleet))   // seals estimates
		p.add(kvRead(streams.BucketCache))   // answers from the response cache
		p.add(streamRead(streams.Results))   // HTTP waits read a stored result
		p.add(follow())                      // HTTP streams relay any job's chunks
		// callers' files and batches (services/batches), whose jobs a
		// batch's cancel cancels as the result service does
		p.add(kvWrite(streams.BucketBatches))
		p.add(kvWatch(streams.BucketBatches, "")) // counts and lists a tenant's files and batches
		p.add(objectStore(streams.ObjectFiles))
		p.add(perms{pub: []string{mesh.CancelledSubjectPrefix + "*.*"}})
		p.add(perms{
			pub: []string{job.QueuePrefix + ">", job.StorePrefix + ">", job.ResultPrefix + ">", job.IntakePrefix + ">",
				job.CancelPrefix + ">"}, // a streaming client went away
			// wait hints (queue group ingest) and results the HTTP API waits for
			sub:       []string{job.WaitPrefix + "*", job.ResultPrefix + ">"},
			responses: true,
		})
	case Admission:
		p.add(consumer(streams.Queue, "*", true)) // one per tenant: keys.AdmissionConsumer
		p.add(kvWrite(streams.BucketBudgets))
		p.add(kvWatch(streams.BucketBudgets, keys.HealthPrefix)) // deployments' health
		p.add(kvRead(streams.BucketFleet))                       // checks seals, signs reservations
		p.add(perms{
			pub:       []string{job.DispatchPrefix + ">", job.StorePrefix + ">", lane.Prefix + ">"},
			sub:       []string{whySubjects, mesh.TransitSubject, mesh.CancelledSubjectPrefix + "*.*"},
			responses: true, // answers "why does this job wait"
		})
		p.add(scheduleOwner)
	case Executor:
		p.add(consumer(streams.Dispatch, "*", true))
		p.add(consumer(streams.Lane, "*", true)) // the batch lane's collectors (services/lane)
		p.add(streamRead(streams.Lane))
		p.add(kvWatch(streams.BucketBudgets, "lane.")) // lists the lane's batch records
		p.add(perms{pub: []string{api + "CONSUMER.PAUSE." + streams.Dispatch + ".*",
			api + "STREAM.PURGE." + streams.DLQ}}) // a tenant's dead letters beyond its bound (internal/dlq)
		p.add(kvWrite(streams.BucketBudgets))
		p.add(kvWatch(streams.BucketBudgets, keys.HealthPrefix)) // deployments' health
		p.add(kvWrite(streams.BucketIdempotency))
		p.add(kvRead(streams.BucketFleet))  // verifies reservations
		p.add(kvWrite(streams.BucketCache)) // stores complete answers
		p.add(follow())                     // what a lost executor streamed of a job (resume.go)
		p.add(perms{
			pub:       []string{job.QueuePrefix + ">", job.StorePrefix + ">", job.DLQPrefix + ">", mesh.TransitSubject, job.StreamPrefix + ">"},
			sub:       []string{job.CancelPrefix + ">", executorWhySubjects},
			responses: true, // answers "why does this job wait" and a cancel's request
		})
		p.add(scheduleOwner)
	case Result:
		p.add(consumer(streams.Results, "result", false))
		p.add(kvWrite(streams.BucketResults))
		p.add(kvWatch(streams.BucketResults, "")) // GET /v1/jobs lists a tenant's keys
		p.add(kvWrite(streams.BucketIdempotency))
		p.add(streamRead(streams.Results))
		// It settles spend holds: the spend windows of the budgets bucket only.
		p.add(kvRead(streams.BucketBudgets))
		p.add(perms{pub: []string{"$KV." + streams.BucketBudgets + "." + keys.SpendPrefix + ">"}})
		p.add(perms{pub: []string{job.StorePrefix + ">", whySubjects, executorWhySubjects, job.CancelPrefix + ">", mesh.CancelledSubjectPrefix + "*.*"},
			sub: []string{job.ResultPrefix + ">"}})
	case Operator:
		p.add(perms{pub: []string{api + ">", "$KV.>", "$JS.ACK.>", "sluice.>"}, sub: []string{"sluice.>"}})
	}
	return p
}

// responseExpiry bounds how long a role with allow_responses may answer a
// request it received (once): its requesters wait far less (a wait hint
// 250 ms, a "why" 200 ms). Each answer is also checked against the
// reply subjects a service may answer on (mesh.ReplyAllowed).
const responseExpiry = 10 * time.Second

// scheduleOwner asks, and serves as, the owner of a model's schedule
// (internal/budget owner.go): admission and executors.
var scheduleOwner = perms{pub: []string{budget.OwnerSubjectPrefix + ">"}, sub: []string{budget.OwnerSubjectPrefix + ">"}, responses: true}

// Fleet-wide signal subjects (internal/mesh).
const (
	whySubjects         = mesh.WhySubjectPrefix + "*.*"
	executorWhySubjects = mesh.ExecutorWhySubjectPrefix + "*.*"
)

// ServicePermissions are the permissions of a role set (SetName).
func ServicePermissions(set string) (*server.Permissions, error) {
	roles, err := ParseSet(set)
	if err != nil {
		return nil, err
	}
	var p perms
	if set != Operator {
		p.add(info())
		// configuration reloads (internal/node reload.go)
		p.add(perms{pub: []string{mesh.ReloadSubject, mesh.ReloadedSubject}, sub: []string{mesh.ReloadSubject}})
	}
	for _, r := range roles {
		p.add(rolePerms(r))
	}
	p.sub = append(p.sub, ServiceInboxPrefix(set)+".>")
	return p.permissions(), nil
}

// TenantPermissions are a tenant's: publish its jobs, ask for a wait hint,
// read its own results, its own streamed chunks (live, as published) and
// its own replies; nothing else.
func TenantPermissions(tenant string) *server.Permissions {
	p := perms{
		pub: []string{job.IntakeSubject(tenant), job.WaitSubject(tenant)},
		sub: []string{job.ResultPrefix + tenant + ".>", job.StreamPrefix + tenant + ".>", client.InboxPrefix(tenant) + ".>"},
	}
	return p.permissions()
}

func (p perms) permissions() *server.Permissions {
	norm := func(s []string) []string {
		s = slices.Clone(s)
		slices.Sort(s)
		return slices.Compact(s)
	}
	out := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: norm(p.pub)},
		Subscribe: &server.SubjectPermission{Allow: norm(p.sub)},
	}
	if p.responses {
		out.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: responseExpiry}
	}
	return out
}
