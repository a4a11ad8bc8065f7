package adapt

import "github.com/sluice-dev/sluice/internal/config"

// For is what adaptation needs of a model's configuration.
func For(a config.Admission, m config.Model) Config {
	return Config{RPM: m.RPM, TPM: m.TokenLimit(), OTPM: m.OTPM, SplitOutput: m.SplitsOutput(),
		Adapts: m.Adapts(), Discovers: m.Discovers(), BurstFraction: a.BurstFraction, NoWarmUp: !m.WarmsUp()}
}
