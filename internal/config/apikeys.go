package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// APIKey is one of a tenant's HTTP keys beside api_key_env: the variable
// or file holding it, when it stops being accepted, and the models it may
// call. A file is read at start and at every reload, so a key can be
// added without restarting (a process's environment is fixed at start).
type APIKey struct {
	Env  string `yaml:"env"`
	File string `yaml:"file"`
	// Expires is an RFC 3339 instant ("2026-12-31T00:00:00Z"); empty: never.
	Expires string `yaml:"expires"`
	// Models the key may call, by the names callers send; empty: all.
	Models []string `yaml:"models"`
}

// ExpiresAt is Expires parsed (zero: never, or not a valid instant, which
// validation refuses).
func (k APIKey) ExpiresAt() time.Time {
	t, _ := time.Parse(time.RFC3339, k.Expires)
	return t
}

// Credential is one resolved tenant key.
type Credential struct {
	Key     string // the secret; never logged
	Tenant  string
	Env     string    // the variable or file that holds it
	Expires time.Time // zero: never
	Models  []string  // empty: every model
}

// credentials lists every key variable of the tenants: api_key_env, then
// api_keys, with the key path of each.
func (c *Config) credentials(getenv func(string) string) (out []Credential, paths []string) {
	for i, t := range c.Tenants {
		if t.APIKeyEnv != "" {
			out = append(out, Credential{Key: strings.TrimSpace(getenv(t.APIKeyEnv)), Tenant: t.Name, Env: t.APIKeyEnv})
			paths = append(paths, fmt.Sprintf("tenants[%d].api_key_env", i))
		}
		for j, k := range t.APIKeys {
			cr := Credential{Tenant: t.Name, Env: k.Env, Expires: k.ExpiresAt(), Models: k.Models}
			path := fmt.Sprintf("tenants[%d].api_keys[%d].env", i, j)
			if k.File != "" {
				data, _ := os.ReadFile(k.File) // unreadable: no key, which is refused
				cr.Key, cr.Env, path = strings.TrimSpace(string(data)), k.File, path[:len(path)-len("env")]+"file"
			} else {
				cr.Key = strings.TrimSpace(getenv(k.Env))
			}
			out = append(out, cr)
			paths = append(paths, path)
		}
	}
	return out, paths
}

// Credentials resolves the tenants' HTTP keys from the environment. A
// variable that is unset or empty is an error naming it (a key that
// silently goes missing would leave its callers locked out), unless its
// key has expired; so is a key held twice (which tenant, which models
// would a caller get?). The errors never show a key.
func (c *Config) Credentials(getenv func(string) string, now time.Time) ([]Credential, error) {
	all, paths := c.credentials(getenv)
	var out []Credential
	var errs []error
	seen := map[string]string{}
	for i, k := range all {
		switch {
		case k.Key == "" && !k.Expires.IsZero() && !now.Before(k.Expires):
			continue // expired and gone: nothing to refuse
		case k.Key == "":
			what := "is unset or empty; export it"
			if strings.HasSuffix(paths[i], ".file") {
				what = "is missing, unreadable or empty; write the key there"
			}
			errs = append(errs, fmt.Errorf("%s (tenant %s): %s %s, or remove the key", paths[i], k.Tenant, k.Env, what))
			continue
		}
		if other, ok := seen[k.Key]; ok {
			errs = append(errs, fmt.Errorf("%s (tenant %s): the key in %s is also held by %s; every key must be different", paths[i], k.Tenant, k.Env, other))
			continue
		}
		seen[k.Key] = fmt.Sprintf("tenant %q (%s)", k.Tenant, k.Env)
		out = append(out, k)
	}
	return out, errors.Join(errs...)
}

// TenantKeys is Credentials as key -> tenant.
func (c *Config) TenantKeys(getenv func(string) string) (map[string]string, error) {
	creds, err := c.Credentials(getenv, time.Now())
	out := make(map[string]string, len(creds))
	for _, k := range creds {
		out[k.Key] = k.Tenant
	}
	return out, err
}

// checkAPIKeys checks a tenant's api_keys.
func (c *Config) checkAPIKeys(key string, t Tenant, fail failFunc) {
	for j, k := range t.APIKeys {
		kp := fmt.Sprintf("%s.api_keys[%d]", key, j)
		switch {
		case (k.Env == "") == (k.File == ""):
			fail(kp+".env", "give env (a variable) or file (a path holding the key), one of them")
		case k.Env != "" && !envName(k.Env):
			fail(kp+".env", "must name an environment variable (the key itself never sits in the file), got %q", clip.String(k.Env, shown))
		}
		if k.Env != "" && k.Env == t.APIKeyEnv {
			fail(kp+".env", "%s is already the tenant's api_key_env", k.Env)
		}
		if k.Expires != "" {
			if _, err := time.Parse(time.RFC3339, k.Expires); err != nil {
				fail(kp+".expires", "want an RFC 3339 instant such as 2026-12-31T00:00:00Z, got %q", clip.String(k.Expires, shown))
			}
		}
		for m, name := range k.Models {
			if _, _, ok := c.ModelRef(name); !ok {
				fail(fmt.Sprintf("%s.models[%d]", kp, m), "%q is not a configured model", clip.String(name, shown))
			}
		}
	}
}

// keyEnvProblems reports every tenant key variable that is unset (an
// expired key's may be), and keys held twice. The problems never show a
// key.
func (c *Config) keyEnvProblems(getenv func(string) string) Problems {
	var ps Problems
	all, paths := c.credentials(getenv)
	seen := map[string]string{}
	now := time.Now()
	for i, k := range all {
		file := strings.HasSuffix(paths[i], ".file")
		if !file && !envName(k.Env) {
			continue
		}
		if k.Key == "" {
			switch {
			case !k.Expires.IsZero() && !now.Before(k.Expires):
			case file:
				ps = append(ps, Problem{Key: paths[i], Msg: fmt.Sprintf("%s is missing, empty or unreadable; write the key there (mode 0600)", k.Env)})
			default:
				ps = append(ps, Problem{Key: paths[i],
					Msg: fmt.Sprintf("%s is not set; export %s=<a long random string>, a bearer key tenant %q's callers send", k.Env, k.Env, k.Tenant)})
			}
			continue
		}
		if other, ok := seen[k.Key]; ok {
			ps = append(ps, Problem{Key: paths[i],
				Msg: fmt.Sprintf("tenant %q's key (%s) is also held by %s; every key must be different", k.Tenant, k.Env, other)})
			continue
		}
		seen[k.Key] = fmt.Sprintf("tenant %q (%s)", k.Tenant, k.Env)
	}
	return ps
}
