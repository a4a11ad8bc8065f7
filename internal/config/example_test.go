package config_test

import (
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
)

func ExampleParse() {
	c, err := config.Parse([]byte(readmeExample))
	if err != nil {
		fmt.Println(err)
		return
	}
	p, m, _ := c.ModelRef("gpt-4o-mini")
	fmt.Println(p.Name, p.Kind, m.RPM, m.TPM, c.Admission.Slice.D())

	_, err = config.Parse([]byte("admission:\n  slice: 5 minutes\n"))
	fmt.Println(err)
	// Output:
	// openai openai 500 200000 250ms
	// config: admission.slice: "5 minutes" is not a duration (like 500ms, 8s, 5m) (line 2)
}
