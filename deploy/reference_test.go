package deploy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

var update = flag.Bool("update", false, "rewrite the generated pages under docs/reference instead of comparing them")

const regenReference = "make reference"

// TestReferenceChartValues: docs/reference/chart-values.md is what
// chartValuesReference writes from values.yaml (its order, defaults and
// comments) and values.schema.json (types, ranges, patterns, descriptions).
// `make reference` rewrites it.
func TestReferenceChartValues(t *testing.T) {
	page, err := chartValuesReference(filepath.Join(chartDir, "values.yaml"), filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	clidoc.CheckGenerated(t, filepath.Join(repoRoot(t), "docs", "reference", "chart-values.md"), page, *update, regenReference)
}

type schemaNode struct {
	Type        any                    `json:"type"`
	Enum        []any                  `json:"enum"`
	Minimum     *float64               `json:"minimum"`
	Maximum     *float64               `json:"maximum"`
	MinLength   *int                   `json:"minLength"`
	Pattern     string                 `json:"pattern"`
	Description string                 `json:"description"`
	Properties  map[string]*schemaNode `json:"properties"`
	Items       *schemaNode            `json:"items"`
	AnyOf       []*schemaNode          `json:"anyOf"`
}

// chartValuesReference renders the values reference: one row per value
// (objects the schema describes key by key get a row of their own and one
// per key), in values.yaml's order, then the keys only the schema has.
func chartValuesReference(valuesPath, schemaPath string) (string, error) {
	raw, err := os.ReadFile(valuesPath)
	if err != nil {
		return "", err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", err
	}
	sraw, err := os.ReadFile(schemaPath)
	if err != nil {
		return "", err
	}
	var schema schemaNode
	if err := json.Unmarshal(sraw, &schema); err != nil {
		return "", err
	}
	var b bytes.Buffer
	b.WriteString("# Chart values reference\n\n")
	fmt.Fprintf(&b, "<!-- Generated from deploy/helm/eztunnel/values.yaml and values.schema.json; do not edit. Regenerate with: %s -->\n\n", regenReference)
	fmt.Fprintf(&b, "Every value of the Helm chart `deploy/helm/eztunnel`, in the order of its `values.yaml`, with its default, "+
		"what `values.schema.json` accepts, and the comment `values.yaml` gives it. Generated (`%s`); a test fails when this page and the chart differ. "+
		"`helm install` refuses a value the schema does not accept and any key not listed here. "+
		"How the values fit together: [the Kubernetes guide](../kubernetes.md).\n\n", regenReference)
	b.WriteString("| value | default | accepts | meaning |\n|---|---|---|---|\n")
	root := doc.Content[0]
	var rows func(prefix string, m *yaml.Node, s *schemaNode)
	rows = func(prefix string, m *yaml.Node, s *schemaNode) {
		seen := map[string]bool{}
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			seen[k.Value] = true
			var ks *schemaNode
			if s != nil {
				ks = s.Properties[k.Value]
			}
			path := prefix + k.Value
			comment := comments(k.HeadComment, k.LineComment, v.LineComment)
			if i == 0 && prefix == "" {
				comment = comments(k.LineComment, v.LineComment) // the file's own header
			}
			if v.Kind == yaml.MappingNode && ks != nil && ks.Properties != nil {
				if comment != "" || ks.Description != "" {
					fmt.Fprintf(&b, "| `%s` | | %s | %s |\n", path, accepts(ks), meaning(comment, ks))
				}
				rows(path+".", v, ks)
				continue
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", path, defaultOf(v), accepts(ks), meaning(comment, ks))
		}
		if s == nil {
			return
		}
		var extra []string
		for k := range s.Properties {
			if !seen[k] {
				extra = append(extra, k)
			}
		}
		sort.Strings(extra)
		for _, k := range extra {
			ks := s.Properties[k]
			fmt.Fprintf(&b, "| `%s` | (unset) | %s | %s |\n", prefix+k, accepts(ks), meaning("", ks))
		}
	}
	rows("", root, &schema)
	return b.String(), nil
}

// comments joins YAML comments into one line of text.
func comments(cs ...string) string {
	var words []string
	for _, c := range cs {
		for _, l := range strings.Split(c, "\n") {
			l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
			words = append(words, strings.Fields(l)...)
		}
	}
	return strings.Join(words, " ")
}

func meaning(comment string, s *schemaNode) string {
	text := comment
	if s != nil && s.Description != "" && !strings.Contains(comment, s.Description) {
		if text != "" {
			text += " "
		}
		text += "(Schema: " + s.Description + ".)"
	}
	return mdCell(text)
}

func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}

// defaultOf is a value's default as a code span (flow YAML for lists and maps).
func defaultOf(v *yaml.Node) string {
	var x any
	if err := v.Decode(&x); err != nil {
		return "?"
	}
	var s string
	switch x := x.(type) {
	case nil:
		s = "null"
	case string:
		if x == "" {
			return "`\"\"`"
		}
		s = x
	default:
		j, _ := json.Marshal(x)
		s = string(j)
	}
	return "`" + strings.ReplaceAll(s, "|", `\|`) + "`"
}

// accepts describes what the schema allows for one value.
func accepts(s *schemaNode) string {
	if s == nil {
		return "(not in the schema)"
	}
	var parts []string
	if len(s.Enum) > 0 {
		var e []string
		for _, v := range s.Enum {
			j, _ := json.Marshal(v)
			e = append(e, "`"+string(j)+"`")
		}
		parts = append(parts, "one of "+strings.Join(e, ", "))
	} else if t := typeOf(s); t != "" {
		parts = append(parts, t)
	}
	if s.Minimum != nil || s.Maximum != nil {
		r := "range "
		if s.Minimum != nil {
			r += strconv.FormatFloat(*s.Minimum, 'f', -1, 64)
		}
		r += ".."
		if s.Maximum != nil {
			r += strconv.FormatFloat(*s.Maximum, 'f', -1, 64)
		}
		parts = append(parts, r)
	}
	if s.MinLength != nil && *s.MinLength > 0 {
		parts = append(parts, fmt.Sprintf("at least %d characters", *s.MinLength))
	}
	if s.Pattern != "" {
		parts = append(parts, "matching `"+strings.ReplaceAll(s.Pattern, "|", `\|`)+"`")
	}
	if len(s.AnyOf) > 0 {
		var alts []string
		for _, a := range s.AnyOf {
			alts = append(alts, accepts(a))
		}
		parts = append(parts, "either "+strings.Join(alts, "; or "))
	}
	if s.Items != nil {
		parts = append(parts, "items: "+accepts(s.Items))
	}
	return strings.Join(parts, ", ")
}

func typeOf(s *schemaNode) string {
	switch t := s.Type.(type) {
	case string:
		return t
	case []any:
		var ts []string
		for _, x := range t {
			ts = append(ts, fmt.Sprint(x))
		}
		return strings.Join(ts, " or ")
	}
	return ""
}
