package node

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/health"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// A reload re-reads the process's own configuration file (Options.Load,
// which resolves it as `sluice up` did: flags and SLUICE_* variables over
// the file), checks it as a start would, and puts it in effect whole
// (config.Live) or not at all. What cannot change in a running process
// (config.Config.Restart) refuses the whole reload, naming the keys. Jobs
// in flight keep what they took; new placements see the new limits.

// reloader applies reloads, one at a time.
type reloader struct {
	o       Options
	live    *config.Live
	auth    api.Auth
	ms      *metrics.Set
	nc      *nats.Conn
	log     *slog.Logger
	process string
	health  *health.Registry // the deployments' health view, or nil

	mu   sync.Mutex
	hash string // of the file in effect
}

func newReloader(o Options, live *config.Live, auth api.Auth, ms *metrics.Set, nc *nats.Conn) *reloader {
	host, _ := os.Hostname()
	return &reloader{o: o, live: live, auth: auth, ms: ms, nc: nc, log: o.Log, hash: o.ConfigHash,
		process: fmt.Sprintf("%s-%d", host, os.Getpid())}
}

// apply reloads this process's configuration and says what came of it.
func (r *reloader) apply(source string) mesh.ReloadReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := mesh.ReloadReport{Process: r.process, Services: strings.Join(r.o.Services, ","), Hash: r.hash}
	refuse := func(err error) mesh.ReloadReport {
		rep.Error = err.Error()
		r.log.Error("reload refused: the running configuration stays in effect", "source", source, "hash", r.hash, "err", err)
		return rep
	}
	if r.o.Load == nil {
		return refuse(errors.New("this process was started without a configuration file to re-read"))
	}
	c, hash, err := r.o.Load()
	if err != nil {
		return refuse(err)
	}
	c = withOpenTenant(c)
	old := r.live.Load()
	if keys := c.Restart(old); len(keys) > 0 {
		return refuse(config.RestartError(keys))
	}
	changed := c.Changes(old)
	if len(changed) == 0 {
		rep.Applied, rep.Unchanged, rep.Hash = true, true, hash
		r.hash = hash
		r.log.Info("configuration reloaded: nothing changed", "source", source, "hash", hash)
		return rep
	}
	keys, tenants, err := authKeys(r.o, c)
	if err != nil {
		return refuse(err)
	}
	if servesAPI(r.o) {
		r.auth.Set(keys, tenants)
	}
	r.live.Store(c)
	setLimitGauges(r.ms, c)
	r.publishLimits(c)
	r.hash = hash
	rep.Applied, rep.Hash, rep.Changed = true, hash, changed
	r.log.Info("configuration reloaded", "source", source, "hash", hash, "changed", strings.Join(changed, ","))
	if added := addedTenants(old, c); len(added) > 0 && r.o.NATSURL == "" {
		r.log.Warn("reload: new tenants use the HTTP API now; their NATS logins on the embedded server come with the next restart", "tenants", strings.Join(added, ","))
	}
	if r.health != nil {
		r.health.Set(deploymentsOf(c)) // added ones start up, removed ones leave /readyz
	}
	return rep
}

// publishLimits puts the configuration now in effect where `sluice queue`
// reads the fleet's limits (limits.go), as a start does. A process whose
// NATS identity may not write the fleet bucket leaves it to one that may.
func (r *reloader) publishLimits(c *config.Config) {
	if r.nc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(r.nc)
	if err == nil {
		var fleet jetstream.KeyValue
		if fleet, err = js.KeyValue(ctx, streams.BucketFleet); err == nil {
			err = publishLimits(ctx, fleet, c)
		}
	}
	if err != nil {
		r.log.Debug("reload: the fleet's published limits are left to another process", "err", err)
	}
}

// addedTenants are the tenants c has and old had not.
func addedTenants(old, c *config.Config) []string {
	var out []string
	for _, t := range c.Tenants {
		if _, ok := old.Tenant(t.Name); !ok {
			out = append(out, t.Name)
		}
	}
	return out
}

// fleet reloads this process, then, when it applied the change, asks
// every other process to reload too.
func (r *reloader) fleet(source string) mesh.ReloadReport {
	rep := r.apply(source)
	rep.ID = job.NewID()
	r.report(rep)
	if rep.Applied && !rep.Unchanged {
		n := mesh.ReloadNotice{ID: rep.ID, From: r.process, Hash: rep.Hash}
		data, _ := json.Marshal(n)
		if err := r.nc.Publish(mesh.ReloadSubject, data); err != nil {
			r.log.Error("reload: could not ask the other processes to reload", "err", err)
		}
	}
	return rep
}

// report publishes rep for `sluice reload` and the logs of others.
func (r *reloader) report(rep mesh.ReloadReport) {
	data, _ := json.Marshal(rep)
	if err := r.nc.Publish(mesh.ReloadedSubject, data); err != nil {
		r.log.Warn("reload: could not publish the outcome", "err", err)
	}
}

// run applies reloads until ctx ends: those requests names (SIGHUP,
// passed by `sluice up`) and those the fleet asks on NATS.
func (r *reloader) run(ctx context.Context) error {
	notices := make(chan mesh.ReloadNotice, 4)
	sub, err := r.nc.Subscribe(mesh.ReloadSubject, func(m *nats.Msg) {
		var n mesh.ReloadNotice
		if err := json.Unmarshal(m.Data, &n); err != nil || !job.ValidName(n.ID) {
			r.log.Warn("reload: malformed notice ignored", "subject", m.Subject)
			return
		}
		select {
		case notices <- n:
		default:
			r.log.Warn("reload: notices arrive faster than they are applied; one dropped", "id", n.ID)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", mesh.ReloadSubject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case source := <-r.o.ReloadRequests:
			r.fleet(source)
		case n := <-notices:
			if n.From == r.process {
				continue
			}
			rep := r.apply("fleet notice " + n.ID)
			rep.ID = n.ID
			r.report(rep)
		}
	}
}

// adminReload serves POST /admin/reload: with the operator's key
// (server.operator_key_env), this process reloads and asks the others to;
// the answer is its own outcome (200 applied, 409 refused).
func (r *reloader) adminReload(key string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if key == "" {
			api.Error(w, http.StatusNotFound, "invalid_request_error", "not_found",
				"no operator key configured (server.operator_key_env): the admin endpoints are off")
			return
		}
		got, _ := api.BearerKey(req.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare([]byte(got), []byte(key)) != 1 {
			api.Error(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "the admin endpoints need the operator key (server.operator_key_env)")
			return
		}
		r.log.Info("reloading configuration", "source", "POST /admin/reload", "remote", req.RemoteAddr)
		rep := r.fleet("POST /admin/reload")
		status := http.StatusOK
		if !rep.Applied {
			status = http.StatusConflict
		}
		api.JSON(w, status, rep)
	})
}

// authKeys resolves the HTTP API's keys of c (fail-closed as at start),
// the model lists by the names the models are configured under.
func authKeys(o Options, c *config.Config) (map[string]api.Key, []string, error) {
	var tenants []string
	for _, t := range c.Tenants {
		tenants = append(tenants, t.Name)
	}
	if !servesAPI(o) {
		return nil, tenants, nil
	}
	creds, err := c.Credentials(o.Getenv, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("tenant API keys: %w", err)
	}
	if len(creds) == 0 && !c.Server.Open {
		return nil, nil, errors.New("no tenant API keys configured, so the HTTP API would be open to anyone: give tenants an api_key_env " +
			"(and export the variables), or run in development mode with server.open: true, --open or SLUICE_OPEN=1")
	}
	keys := make(map[string]api.Key, len(creds))
	for _, k := range creds {
		var models []string
		for _, name := range k.Models {
			if _, m, ok := c.ModelRef(name); ok && !slices.Contains(models, m.Name) {
				models = append(models, m.Name)
			}
		}
		keys[k.Key] = api.Key{Tenant: k.Tenant, Expires: k.Expires, Models: models}
	}
	return keys, tenants, nil
}
