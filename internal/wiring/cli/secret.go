package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// MaxSecretFileBytes bounds a secret file: passwords and tokens are short; a
// larger file is a wrong path, not a secret.
const MaxSecretFileBytes = 64 << 10

// Secret returns a secret from the file at path (a --*-file flag named
// fileFlag) or from the environment-only variable env, never both. The file's
// trailing newlines are trimmed. Errors name the flag or variable, never the
// value. An empty result with a nil error means neither was set.
func Secret(getenv func(string) string, fileFlag, path, env string) (string, error) {
	fromEnv := getenv(env)
	switch {
	case path != "" && fromEnv != "":
		return "", UsageError(fmt.Errorf("set --%s or %s, not both", fileFlag, env))
	case path == "":
		return fromEnv, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", fileFlag, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("--%s: %s: %w", fileFlag, path, err)
	}
	if len(b) > MaxSecretFileBytes {
		return "", fmt.Errorf("--%s: %s: larger than %d bytes", fileFlag, path, MaxSecretFileBytes)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("--%s: %s: %w", fileFlag, path, errEmptySecret)
	}
	return s, nil
}

var errEmptySecret = errors.New("file is empty")
