package deploy

import (
	"errors"
	"fmt"

	"golang.org/x/crypto/bcrypt"
)

// NATSPasswordCost is the bcrypt cost of the hashes in Secret
// compass-nats-users: nats-server's own default (`nats server passwd`). The
// three users that bypass the callout (compass-callout, compass-server,
// compass-kick) pay it once per CONNECT, a few at start and after a lost
// connection, never per Runner.
const NATSPasswordCost = 11

// maxNATSPasswordBytes is bcrypt's limit: it reads at most 72 bytes, and
// golang.org/x/crypto/bcrypt refuses a longer password rather than hash a
// prefix of it.
const maxNATSPasswordBytes = 72

var errNATSPasswordEmpty = errors.New("deploy: nats password: empty")

// NATSPasswordHash is the bcrypt hash, at NATSPasswordCost, that
// compass-nats-users holds for a password. The rendered nats-server reads it
// from its environment (password: $COMPASS_..._NATS_PASSWORD) and compares
// each client's password with it, so the pod that runs nats-server never
// holds the callout's, the Server's or the kick identity's password. The
// "$2a$" form is the one nats-server's configuration parser takes from an
// environment variable; golang.org/x/crypto/bcrypt writes it.
func NATSPasswordHash(password string) (string, error) {
	return natsPasswordHash(password, NATSPasswordCost)
}

func natsPasswordHash(password string, cost int) (string, error) {
	switch {
	case password == "":
		return "", errNATSPasswordEmpty
	case len(password) > maxNATSPasswordBytes:
		return "", fmt.Errorf("deploy: nats password: %d bytes, bcrypt reads at most %d (openssl rand -hex 32 makes 64)", len(password), maxNATSPasswordBytes)
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", fmt.Errorf("deploy: nats password: %w", err)
	}
	return string(h), nil
}
