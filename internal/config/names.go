package config

import (
	"fmt"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/pkg/job"
)

// checkKeyNames refuses names that would make two things share one KV key
// or one consumer (internal/keys): a provider with the reserved name, and
// two models whose DISPATCH consumers would have the same name.
func (c *Config) checkKeyNames(fail failFunc) {
	consumers := map[string]string{} // consumer name -> provider/model
	for i, p := range c.Providers {
		key := fmt.Sprintf("providers[%d]", i)
		if msg := keys.ProviderProblem(p.Name); msg != "" {
			fail(key+".name", "%q %s", p.Name, msg)
		}
		for j, m := range p.Models {
			name := keys.DispatchConsumer(p.Name, job.ModelToken(m.Name))
			if other, ok := consumers[name]; ok && other != p.Name+"/"+m.Name {
				fail(fmt.Sprintf("%s.models[%d].name", key, j), "provider %q, model %q and %s have one executor consumer name, %q: rename a provider or a model", p.Name, m.Name, other, name)
			}
			consumers[name] = p.Name + "/" + m.Name
		}
	}
}
