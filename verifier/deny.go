package verifier

import (
	"errors"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"
)

// MaxDenyEntries bounds each deny list of a cluster. Denying a node is an
// incident response for a handful of nodes; a list this long is a mistake
// (deny the cluster instead by removing it).
const MaxDenyEntries = 1000

// NodeDeny is a cluster's per-node deny list (DL-440 OQ-1): the one lever that
// cuts a single node off without cluster access. A token whose
// kubernetes.io node name is in Nodes, or whose node UID is in NodeUIDs, is
// refused at both doors with the one failure shape; the cause names the rule
// that matched and the node, never the token.
//
// Denying by name stops every pod the node runs now or later under that name;
// denying by UID stops one incarnation of the node, so a node rebuilt under
// the same name (a new UID) is let in again.
type NodeDeny struct {
	Nodes    []string // node names, as in kubernetes.io.node.name
	NodeUIDs []string // node UIDs, as in kubernetes.io.node.uid
}

// ErrNodeDenied is the cause of a refusal by a deny list; it also satisfies
// ErrUnauthenticated, like every other refusal.
var ErrNodeDenied = errors.New("node denied")

func (d *NodeDeny) clone() *NodeDeny {
	if d == nil {
		return nil
	}
	return &NodeDeny{Nodes: slices.Clone(d.Nodes), NodeUIDs: slices.Clone(d.NodeUIDs)}
}

// check validates a deny list built in code or parsed.
func (d *NodeDeny) check() error {
	if d == nil {
		return nil
	}
	if len(d.Nodes) > MaxDenyEntries || len(d.NodeUIDs) > MaxDenyEntries {
		return fmt.Errorf("more than %d entries in one list", MaxDenyEntries)
	}
	for i, n := range d.Nodes {
		if !validNodeName(n) {
			return fmt.Errorf("nodes[%d]: %q is not a Kubernetes node name", i, n)
		}
	}
	for i, u := range d.NodeUIDs {
		if !validNodeUID(u) {
			return fmt.Errorf("nodeUIDs[%d]: %q is not a Kubernetes UID", i, u)
		}
	}
	return nil
}

// match returns the refusal cause for a node, or nil when it is not denied.
func (d *NodeDeny) match(node, uid string) error {
	if d == nil {
		return nil
	}
	if slices.Contains(d.Nodes, node) {
		return fmt.Errorf("%w: node %s is in deny.nodes", ErrNodeDenied, node)
	}
	// An empty UID (a token without one) matches nothing: check rejects
	// empty entries.
	if uid != "" && slices.Contains(d.NodeUIDs, uid) {
		return fmt.Errorf("%w: node %s uid %s is in deny.nodeUIDs", ErrNodeDenied, node, uid)
	}
	return nil
}

// parseDeny reads a cluster's "deny" mapping: {nodes: [...], nodeUIDs: [...]}.
func parseDeny(n *yaml.Node) (*NodeDeny, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("want a mapping with nodes and nodeUIDs lists (line %d)", n.Line)
	}
	d := &NodeDeny{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var dst *[]string
		switch k.Value {
		case "nodes":
			dst = &d.Nodes
		case "nodeUIDs":
			dst = &d.NodeUIDs
		default:
			return nil, fmt.Errorf("unknown key %q (line %d); known keys are nodes, nodeUIDs", k.Value, k.Line)
		}
		if seen[k.Value] {
			return nil, fmt.Errorf("duplicate key %q (line %d)", k.Value, k.Line)
		}
		seen[k.Value] = true
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue
		}
		if v.Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%s: want a list (line %d)", k.Value, v.Line)
		}
		for j, e := range v.Content {
			if e.Kind != yaml.ScalarNode || e.Tag != "!!str" {
				return nil, fmt.Errorf("%s[%d]: want a string (line %d)", k.Value, j, e.Line)
			}
			*dst = append(*dst, e.Value)
		}
	}
	return d, nil
}
