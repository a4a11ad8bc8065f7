package natsauth

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-dev/sluice/internal/config"
)

// Embedded is how the embedded server is secured.
type Embedded struct {
	Users []*server.User     // tenants, each in its own account
	Nkeys []*server.NkeyUser // service role sets and the operator, in the global account
	// Accounts are the global account (JetStream, the tenants' exports)
	// and one per tenant; none when authentication is off.
	Accounts []*server.Account
	TLS      *tls.Config // nil: plain TCP
	Secrets  *Secrets    // nil when authentication is off
	// Tenants without a key, who cannot connect over NATS.
	NoKey []string
}

// AuthOn reports whether the embedded server requires authentication:
// server.nats.auth, or by default whether tenants are configured.
func AuthOn(c *config.Config) bool {
	if a := c.Server.NATS.Auth; a != nil {
		return *a
	}
	return len(c.Tenants) > 0
}

// ForEmbedded prepares the embedded server's users (creating the service
// identities in dataDir when missing) and its TLS.
func ForEmbedded(c *config.Config, dataDir string, getenv func(string) string) (*Embedded, error) {
	e := &Embedded{}
	if lt := c.Server.NATS.ListenTLS; lt.Cert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: lt.Cert, KeyFile: lt.Key, CaFile: lt.CA, Verify: lt.CA != ""})
		if err != nil {
			return nil, fmt.Errorf("server.nats.listen_tls: %w", err)
		}
		e.TLS = tc
	}
	if !AuthOn(c) {
		return e, nil
	}
	sec, err := EnsureSecrets(dataDir)
	if err != nil {
		return nil, err
	}
	e.Secrets = sec
	sets, pubs, err := sec.Public()
	if err != nil {
		return nil, err
	}
	for _, set := range sets {
		p, err := ServicePermissions(set)
		if err != nil {
			return nil, err
		}
		e.Nkeys = append(e.Nkeys, &server.NkeyUser{Nkey: pubs[set], Permissions: p})
	}
	var names []string
	keys := map[string]string{}
	for _, t := range c.Tenants {
		key := tenantKey(t, getenv)
		if key == "" {
			e.NoKey = append(e.NoKey, t.Name)
			continue
		}
		names = append(names, t.Name)
		keys[t.Name] = key
	}
	global, accounts, err := embeddedAccounts(names, TenantLimitsFor(c))
	if err != nil {
		return nil, err
	}
	e.Accounts = append(e.Accounts, global)
	for _, t := range names {
		e.Accounts = append(e.Accounts, accounts[t])
		e.Users = append(e.Users, &server.User{Username: t, Password: keys[t], Permissions: TenantPermissions(t), Account: accounts[t]})
	}
	return e, nil
}

func tenantKey(t config.Tenant, getenv func(string) string) string {
	if t.APIKeyEnv == "" {
		return ""
	}
	return strings.TrimSpace(getenv(t.APIKeyEnv))
}

// RouteUser is the user cluster routes authenticate as when the embedded
// server requires authentication; its password is RoutePassword.
const RouteUser = "sluice-route"

// RoutePassword derives the cluster routes' password from the operator's
// seed: nodes that share the secrets file (as they must, so that a service
// reconnecting to another node is known there) share it, and no other
// secret has to be handed out.
func (s *Secrets) RoutePassword() (string, error) {
	seed, ok := s.Seeds[Operator]
	if !ok {
		return "", fmt.Errorf("no %s identity in %s", Operator, SecretsFile)
	}
	sum := sha256.Sum256([]byte("sluice-route\x00" + seed))
	return hex.EncodeToString(sum[:]), nil
}

// Apply sets the server options. With a cluster listener and
// authentication on, routes require RouteUser and the password derived
// from the shared secrets, and present them to the nodes they dial.
func (e *Embedded) Apply(o *server.Options) {
	o.Users, o.Nkeys, o.Accounts = e.Users, e.Nkeys, e.Accounts
	if o.Cluster.Port != 0 && e.Secrets != nil {
		if pass, err := e.Secrets.RoutePassword(); err == nil {
			o.Cluster.Username, o.Cluster.Password = RouteUser, pass
			for i, r := range o.Routes {
				if r.User == nil {
					u := *r
					u.User = url.UserPassword(RouteUser, pass)
					o.Routes[i] = &u
				}
			}
		}
	}
	if e.TLS != nil {
		o.TLSConfig, o.TLS = e.TLS, true
		o.TLSVerify = e.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		o.TLSTimeout = 2
	}
}

// BlockOptions select what AccountsBlock prints.
type BlockOptions struct {
	// Sets are the role sets to print besides the operator; empty: each
	// service role alone and all four together.
	Sets []string
	// BcryptCost for tenants' passwords; 0: bcrypt.DefaultCost.
	BcryptCost int
}

// AccountsBlock renders the nats-server `accounts` block for an external
// server: the service account (ServiceAccount: JetStream, the service
// identities as public nkeys from sec, and the exports to each tenant),
// and one account per tenant (user = tenant, password = bcrypt of its API
// key, read from the environment now; its imports). No secret is printed:
// nkeys are public keys, and nats-server checks a bcrypt hash without
// knowing the key.
func AccountsBlock(c *config.Config, sec *Secrets, getenv func(string) string, o BlockOptions) (string, error) {
	sets := o.Sets
	if len(sets) == 0 {
		sets = append(slices.Clone(ServiceRoles), SetName(ServiceRoles))
	}
	sets = append(sets, Operator)
	_, pubs, err := sec.Public()
	if err != nil {
		return "", err
	}
	cost := o.BcryptCost
	if cost == 0 {
		cost = bcrypt.DefaultCost
	}
	q := strconv.Quote
	var b strings.Builder
	b.WriteString("# Sluice's NATS accounts and users, written by `sluice nats-auth`. Paste into nats-server.conf or\n")
	b.WriteString("# include it (deploy/nats/auth/sluice-auth.conf). Write it again when tenants or keys change.\n")
	b.WriteString("# Services connect with the nkey seeds in " + SecretsFile + " (role set -> seed);\n")
	b.WriteString("# tenants as user <tenant> with their Sluice API key as the password. Each tenant has an\n")
	b.WriteString("# account of its own that imports only its own subjects, so a reply subject it sets is\n")
	b.WriteString("# answered inside its account.\n")
	b.WriteString("accounts {\n")
	fmt.Fprintf(&b, "  %s: {\n    jetstream: enabled\n    users: [\n", ServiceAccount)
	seen := map[string]bool{}
	for _, set := range sets {
		if seen[set] {
			continue
		}
		seen[set] = true
		pub, ok := pubs[set]
		if !ok {
			return "", fmt.Errorf("no identity for role set %q in %s", set, SecretsFile)
		}
		p, err := ServicePermissions(set)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "      # service: %s\n", set)
		writeUser(&b, "      ", [][2]string{{"nkey", pub}}, p)
	}
	b.WriteString("    ]\n")
	var tenants strings.Builder
	if len(c.Tenants) > 0 {
		b.WriteString("    exports: [\n")
	}
	for _, t := range c.Tenants {
		key := tenantKey(t, getenv)
		if key == "" {
			if t.APIKeyEnv == "" {
				return "", fmt.Errorf("tenant %q has no api_key_env: give it one (its NATS password is that key)", t.Name)
			}
			return "", fmt.Errorf("tenant %q: environment variable %s is unset or empty; set it to the tenant's key (its NATS password is that key)", t.Name, t.APIKeyEnv)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(key), cost)
		if err != nil {
			return "", fmt.Errorf("tenant %q: %w", t.Name, err)
		}
		acc := q(TenantAccount(t.Name))
		fmt.Fprintf(&tenants, "  %s: {\n    %s\n    users: [\n", acc, TenantLimitsFor(c).block())
		fmt.Fprintf(&tenants, "      # tenant: %s (password: bcrypt of $%s)\n", t.Name, t.APIKeyEnv)
		writeUser(&tenants, "      ", [][2]string{{"user", t.Name}, {"password", string(hash)}}, TenantPermissions(t.Name))
		tenants.WriteString("    ]\n    imports: [\n")
		for _, s := range tenantServices(t.Name) {
			fmt.Fprintf(&b, "      { service: %s, accounts: [%s] }\n", q(s), acc)
			fmt.Fprintf(&tenants, "      { service: { account: %s, subject: %s } }\n", ServiceAccount, q(s))
		}
		for _, s := range tenantStreams(t.Name) {
			fmt.Fprintf(&b, "      { stream: %s, accounts: [%s] }\n", q(s), acc)
			fmt.Fprintf(&tenants, "      { stream: { account: %s, subject: %s } }\n", ServiceAccount, q(s))
		}
		tenants.WriteString("    ]\n  }\n")
	}
	if len(c.Tenants) > 0 {
		b.WriteString("    ]\n")
	}
	b.WriteString("  }\n")
	b.WriteString(tenants.String())
	b.WriteString("}\n")
	return b.String(), nil
}

// writeUser writes one user in nats-server's configuration syntax (a
// superset of JSON: strings are quoted, so "$JS.API.>" is not a variable).
func writeUser(b *strings.Builder, indent string, ident [][2]string, p *server.Permissions) {
	q := strconv.Quote
	list := func(s []string) string {
		var l strings.Builder
		l.WriteString("[\n")
		for _, v := range s {
			l.WriteString(indent + "      " + q(v) + "\n")
		}
		l.WriteString(indent + "    ]")
		return l.String()
	}
	b.WriteString(indent + "{\n")
	for _, kv := range ident {
		fmt.Fprintf(b, "%s  %s: %s\n", indent, kv[0], q(kv[1]))
	}
	b.WriteString(indent + "  permissions: {\n")
	fmt.Fprintf(b, "%s    publish: { allow: %s }\n", indent, list(p.Publish.Allow))
	fmt.Fprintf(b, "%s    subscribe: { allow: %s }\n", indent, list(p.Subscribe.Allow))
	if p.Response != nil {
		fmt.Fprintf(b, "%s    allow_responses: { max: %d, expires: %q }\n", indent, p.Response.MaxMsgs, p.Response.Expires.String())
	}
	b.WriteString(indent + "  }\n" + indent + "}\n")
}
