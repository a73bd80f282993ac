package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// envPrefix prefixes the environment variable of every flag.
const envPrefix = "EZTUNNEL_"

// envName is the variable that sets flag name: --max-sockets is EZTUNNEL_MAX_SOCKETS.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindEnv sets every flag of fs that was not given on the command line from
// its environment variable, if that is set. Explicit flags win. help and
// version are not settable this way.
func bindEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" || f.Name == "version" {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("environment variable %s=%q (flag --%s): %v", name, v, f.Name, serr)
		}
	})
	return err
}

// bindOSEnv is bindEnv over the process environment.
func bindOSEnv(fs *pflag.FlagSet) error { return bindEnv(fs, os.LookupEnv) }
