package natsauth

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

// The account boundary. NATS checks what a user may publish, but never the
// reply subject a publisher sets: whoever answers a request, a service or
// JetStream acknowledging a stored message, publishes on that subject with
// its own rights. So permissions alone cannot stop a tenant from aiming an
// answer at another tenant's results or at a bucket's keys. Accounts can:
//
//   - the services, the operator, the streams and the buckets live in one
//     account (ServiceAccount; on the embedded server its global account);
//   - each tenant has an account of its own (TenantAccount) holding its
//     user, which imports its intake and wait subjects as services and its
//     results and streamed chunks as streams; each export names that
//     tenant's account alone.
//
// A request that crosses a service import reaches the service account with
// a reply subject the server makes (_R_.…) and its answer is mapped back
// into the tenant's account, onto the reply the tenant chose, where only
// the tenant's own subjects have subscribers. Stream imports deliver the
// tenant's subjects only.

// ServiceAccount is the account of the services in the block `sluice
// nats-auth` prints. The embedded server keeps them in its global account
// instead, where a data directory made before authentication was on (or
// before accounts) already keeps its streams.
const ServiceAccount = "SLUICE"

// TenantAccount is the name of a tenant's account.
func TenantAccount(tenant string) string { return "tenant-" + tenant }

// tenantServices are the subjects a tenant's account imports as services:
// its intake (JetStream's acknowledgement comes back through the import)
// and its wait hints.
func tenantServices(tenant string) []string {
	return []string{job.IntakeSubject(tenant), job.WaitSubject(tenant)}
}

// tenantStreams are the subjects it imports as streams: its results and
// its streamed chunks.
func tenantStreams(tenant string) []string {
	return []string{job.ResultPrefix + tenant + ".>", job.StreamPrefix + tenant + ".>"}
}

// TenantLimits bound what one tenant's account may take of the server, so
// that no tenant can slow the services every tenant shares: the largest
// message a tenant's client may publish (on its intake and its wait-hint
// subjects alike), its connections, and the subscriptions of each of its
// connections. Without them every account has the server's limits (8 MiB
// messages on the embedded server), and one tenant's large messages on its
// own wait-hint subject stall the services' connection for all.
type TenantLimits struct {
	MaxPayload       int // the largest job: limits.max_body_bytes plus the envelope
	MaxConnections   int
	MaxSubscriptions int // per connection
}

// Default tenant connection and subscription bounds. A client holds one
// subscription per job it awaits (pkg/client), or one for all its results
// (Client.Subscribe).
const (
	TenantMaxConnections   = 256
	TenantMaxSubscriptions = 65536
)

// TenantLimitsFor are the limits of every tenant's account under c.
func TenantLimitsFor(c *config.Config) TenantLimits {
	return TenantLimits{MaxPayload: c.Limits.JobMsgBytes(), MaxConnections: TenantMaxConnections, MaxSubscriptions: TenantMaxSubscriptions}
}

// block is the limits as a nats-server account's `limits` block.
func (l TenantLimits) block() string {
	return fmt.Sprintf("limits: { max_payload: %d, max_connections: %d, max_subscriptions: %d }", l.MaxPayload, l.MaxConnections, l.MaxSubscriptions)
}

// tenantAccount makes a tenant's account with lim. nats-server sets an
// account's limits only from configuration text (or a JWT), so the account
// is parsed from the same block AccountsBlock prints.
func tenantAccount(tenant string, lim TenantLimits) (*server.Account, error) {
	var o server.Options
	if err := o.ProcessConfigString("accounts: { " + strconv.Quote(TenantAccount(tenant)) + ": { " + lim.block() + " } }"); err != nil {
		return nil, fmt.Errorf("tenant %s: account: %w", tenant, err)
	}
	if len(o.Accounts) != 1 {
		return nil, fmt.Errorf("tenant %s: parsed %d accounts, want 1", tenant, len(o.Accounts))
	}
	return o.Accounts[0], nil
}

// embeddedAccounts makes the embedded server's accounts: its global
// account with JetStream and an export per tenant subject, and one account
// per tenant, with lim, importing them.
func embeddedAccounts(tenants []string, lim TenantLimits) (*server.Account, map[string]*server.Account, error) {
	global, err := globalWithJetStream()
	if err != nil {
		return nil, nil, err
	}
	byTenant := map[string]*server.Account{}
	for _, t := range tenants {
		acc, err := tenantAccount(t, lim)
		if err != nil {
			return nil, nil, err
		}
		only := []*server.Account{acc}
		for _, s := range tenantServices(t) {
			if err := global.AddServiceExport(s, only); err != nil {
				return nil, nil, fmt.Errorf("tenant %s: export %s: %w", t, s, err)
			}
			if err := acc.AddServiceImport(global, s, s); err != nil {
				return nil, nil, fmt.Errorf("tenant %s: import %s: %w", t, s, err)
			}
		}
		for _, s := range tenantStreams(t) {
			if err := global.AddStreamExport(s, only); err != nil {
				return nil, nil, fmt.Errorf("tenant %s: export %s: %w", t, s, err)
			}
			if err := acc.AddStreamImport(global, s, ""); err != nil {
				return nil, nil, fmt.Errorf("tenant %s: import %s: %w", t, s, err)
			}
		}
		byTenant[t] = acc
	}
	return global, byTenant, nil
}

// globalWithJetStream returns an account that the server merges into its
// global account ($G), with JetStream enabled. nats-server sets an
// account's JetStream limits only from configuration text, where "$G" is a
// reserved name: so an account is parsed with JetStream on and then given
// the global account's name (the server merges a configured "$G" into its
// own, as it does for top-level subject mappings). Without other accounts
// the server enables JetStream in $G by itself; with tenant accounts it
// does not.
func globalWithJetStream() (*server.Account, error) {
	var o server.Options
	if err := o.ProcessConfigString("accounts: { " + ServiceAccount + ": { jetstream: enabled } }"); err != nil {
		return nil, fmt.Errorf("service account: %w", err)
	}
	if len(o.Accounts) != 1 {
		return nil, fmt.Errorf("service account: parsed %d accounts, want 1", len(o.Accounts))
	}
	acc := o.Accounts[0]
	acc.Name = server.DEFAULT_GLOBAL_ACCOUNT
	return acc, nil
}
