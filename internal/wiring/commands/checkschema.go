package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/store"
)

const checkSchemaHelp = `Checks that the database is at exactly this binary's schema version, and changes
nothing: it never creates a database or applies a migration. Exit 0 when serve may
start on it; 1, with what to do, when the schema is behind this binary (back up the
database, then run this release's compass-server migrate) or ahead of it (a newer
release migrated it: upgrade this binary).

An SQLite data dir without a database passes: serve creates a new database there on
its first start (there is nothing to back up). An empty PostgreSQL database does not:
run compass-server migrate once before the first Server starts.

The rendered Server pod runs it as its init container, so a new image never starts
serve on a schema it was not built for, and never migrates as a side effect: the
rendered migrate Job (compass-server manifests --migrate-job) is the deliberate step
(docs/store.md, Upgrading).`

var checkSchemaCommand = &cli.Command{Name: "check-schema", Summary: "check the database is at this binary's schema; changes nothing (the Server pod's init container)", Help: checkSchemaHelp,
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var sf storeFlags
		sf.register(fs)
		return func(ctx context.Context, in *cli.Invocation) error {
			u := server.DatabaseURL(sf.databaseURL, sf.dataDir)
			v, err := store.CheckSchema(ctx, u)
			switch {
			case errors.Is(err, store.ErrNoDatabase):
				if backend, _ := store.BackendOf(u); backend == "sqlite" {
					fmt.Fprintf(in.Stdout, "%s does not exist yet: serve creates it at schema version %d\n", server.DescribeDatabase(u), store.SchemaVersionWanted())
					return nil
				}
				return fmt.Errorf("server: check-schema: %w", err)
			case errors.Is(err, store.ErrSchemaBehind):
				return fmt.Errorf("server: check-schema: %w (back up the database first: docs/store.md, Upgrading)", err)
			case err != nil:
				return fmt.Errorf("server: check-schema: %w", err)
			}
			fmt.Fprintf(in.Stdout, "%s is at schema version %d, this binary's\n", server.DescribeDatabase(u), v)
			return nil
		}
	},
}
