package helm

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy/deploytest"
)

// object is one rendered Kubernetes object: its reference (kind,
// namespace, name), its canonical JSON (keys sorted, numbers as JSON
// numbers; what decides equality) and its decoded form (for saying where
// two differ).
type object struct {
	ref   string
	canon string
	value map[string]any
}

// decodeObjects splits a multi-document YAML stream, as helm template and
// manifests print it, into objects. Empty documents (helm's "# Source:"
// comments alone, separators) are not objects.
func decodeObjects(data []byte) ([]object, error) {
	docs, err := deploytest.Documents(data)
	if err != nil {
		return nil, fmt.Errorf("test/helm: %w", err)
	}
	var out []object
	for _, doc := range docs {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("test/helm: document %d: %w", len(out)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		canon, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("test/helm: document %d: %w", len(out)+1, err)
		}
		out = append(out, object{ref: refOf(m), canon: string(canon), value: m})
	}
	return out, nil
}

// refOf is "Kind namespace/name" ("Kind name" for a cluster-scoped object).
func refOf(m map[string]any) string {
	kind, _ := m["kind"].(string)
	meta, _ := m["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if ns, _ := meta["namespace"].(string); ns != "" {
		return kind + " " + ns + "/" + name
	}
	return kind + " " + name
}

// refs are the objects' references, sorted.
func refs(objs []object) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = o.ref
	}
	slices.Sort(out)
	return out
}

// maxPaths bounds the differing fields listed for one object: enough to
// see what changed, never a whole dump.
const maxPaths = 8

// diffObjects compares two renderings as multisets of objects (order does
// not matter: helm sorts by kind, manifests by template) and says, for each
// reference whose objects differ, what: printed by one side only, printed a
// different number of times, or printed by both with these fields apart.
// Empty when the multisets are equal.
func diffObjects(aName string, a []object, bName string, b []object) []string {
	count := map[string]int{}
	for _, o := range a {
		count[o.canon]++
	}
	for _, o := range b {
		count[o.canon]--
	}
	// What is left over on each side, by reference.
	left := map[string][2][]object{}
	for side, objs := range [2][]object{a, b} {
		for _, o := range objs {
			c := count[o.canon]
			if (side == 0 && c > 0) || (side == 1 && c < 0) {
				if side == 0 {
					count[o.canon]--
				} else {
					count[o.canon]++
				}
				l := left[o.ref]
				l[side] = append(l[side], o)
				left[o.ref] = l
			}
		}
	}
	var out []string
	for _, ref := range slices.Sorted(maps.Keys(left)) {
		l := left[ref]
		switch {
		case len(l[0]) == 1 && len(l[1]) == 1:
			paths := fieldDiffs("", l[0][0].value, l[1][0].value)
			more := ""
			if len(paths) > maxPaths {
				more = fmt.Sprintf(" and %d more", len(paths)-maxPaths)
				paths = paths[:maxPaths]
			}
			out = append(out, fmt.Sprintf("%s differs at %s%s", ref, strings.Join(paths, ", "), more))
		case len(l[1]) == 0:
			out = append(out, fmt.Sprintf("%s: %d printed by %s only", ref, len(l[0]), aName))
		case len(l[0]) == 0:
			out = append(out, fmt.Sprintf("%s: %d printed by %s only", ref, len(l[1]), bName))
		default:
			out = append(out, fmt.Sprintf("%s: %d of %s's and %d of %s's differ", ref, len(l[0]), aName, len(l[1]), bName))
		}
	}
	return out
}

// fieldDiffs lists the paths (".spec.replicas", ".spec.template...[2]")
// where a and b differ, sorted; values are not printed.
func fieldDiffs(path string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		keys := slices.Sorted(maps.Keys(am))
		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = append(out, fieldDiffs(path+"."+k, am[k], bm[k])...)
		}
		return out
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok && len(as) == len(bs) {
		var out []string
		for i := range as {
			out = append(out, fieldDiffs(fmt.Sprintf("%s[%d]", path, i), as[i], bs[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	if path == "" {
		path = "."
	}
	return []string{path}
}
