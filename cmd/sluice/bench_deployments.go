package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/bench"
)

// deploymentScenarios returns the deployment scenarios a --scenario value
// in args names when it names only those (ok), nil when it names none of
// them, and an error when it mixes them with the other scenarios.
func deploymentScenarios(args []string) (names []string, ok bool, err error) {
	for i, a := range args {
		v, found := "", false
		for _, prefix := range []string{"--scenario=", "-scenario="} {
			if rest, cut := strings.CutPrefix(a, prefix); cut {
				v, found = rest, true
			}
		}
		if (a == "--scenario" || a == "-scenario") && i+1 < len(args) {
			v, found = args[i+1], true
		}
		if !found {
			continue
		}
		var others []string
		for _, n := range strings.Split(v, ",") {
			n = strings.TrimSpace(n)
			if _, dep := bench.LookupDeploymentScenario(n); dep {
				names = append(names, n)
			} else {
				others = append(others, n)
			}
		}
		switch {
		case len(names) == 0:
			return nil, false, nil
		case len(others) > 0:
			return nil, false, fmt.Errorf("--scenario: %s run on their own, apart from %s", strings.Join(names, ","), strings.Join(others, ","))
		}
		return names, true, nil
	}
	return nil, false, nil
}

// runBenchDeployments runs the deployment scenarios (sluice bench
// --scenario deployments,tiers).
func runBenchDeployments(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", stderr)
	scenario := fs.String("scenario", "deployments,tiers", "deployment scenarios: "+strings.Join(bench.DeploymentScenarioNames(), ", "))
	seed := fs.Uint64("seed", 1, "seed of the jobs' text")
	conc := fs.Int("concurrency", 32, "Sluice's max_concurrency for each deployment")
	offerFor := fs.Duration("offer-for", 0, "how long jobs are offered (0: the scenario's)")
	runTimeout := fs.Duration("run-timeout", 8*time.Minute, "deadline of each run; jobs unfinished by then count as failed")
	ttft := fs.Duration("ttft", 200*time.Millisecond, "simulated latency before the first token")
	perToken := fs.Duration("per-token", 2*time.Millisecond, "simulated latency per output token")
	jsonPath := fs.String("json", "", "write the figures here as JSON")
	verbose := fs.Bool("v", false, "the fleet's logs (info) on stderr")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *conc < 1 || *runTimeout <= 0 || *offerFor < 0 {
		return errors.New("want --concurrency >= 1, --run-timeout > 0 and --offer-for >= 0")
	}
	opt := bench.Options{Concurrency: *conc, Seed: *seed, RunTimeout: *runTimeout, TTFT: *ttft, PerToken: *perToken}
	if *verbose {
		opt.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	fmt.Fprintf(stdout, "sluice bench: %s against a simulator per deployment (quantized profile), Sluice told the real limits\n", bench.FleetDescription())
	var results []*bench.DeploymentsResult
	passed := 0
	for _, name := range strings.Split(*scenario, ",") {
		sc, ok := bench.LookupDeploymentScenario(strings.TrimSpace(name))
		if !ok {
			return fmt.Errorf("--scenario: unknown deployment scenario %q (want %s)", name, strings.Join(bench.DeploymentScenarioNames(), ", "))
		}
		if *offerFor > 0 {
			sc.OfferFor = *offerFor
		}
		r, err := bench.RunDeployments(ctx, sc, opt)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.Name, err)
		}
		bench.WriteDeployments(stdout, r)
		results = append(results, r)
		if r.Pass {
			passed++
		}
	}
	fmt.Fprintf(stdout, "\nsluice met %d of %d deployment scenario targets\n", passed, len(results))
	if *jsonPath != "" {
		if err := benchWriteJSON(*jsonPath, results); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}
