package main

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks: every relative Markdown link in the repository's top-level
// documents (README.md, SECURITY.md) and in docs/ (every level) names a file
// or directory that exists, and its #anchor, when it has one and the target
// is Markdown, is one GitHub makes for that file: a heading's slug
// (lowercase, spaces to '-', punctuation other than '-' and '_' removed, a
// repeated slug numbered -1, -2, ...) or an explicit <a id>/<a name>. Moving
// a section to another page, or renaming a heading, cannot leave a link
// behind. Links inside fenced code blocks and code spans are not links.
func TestDocLinks(t *testing.T) {
	const root = "../.."
	files, _ := filepath.Glob(filepath.Join(root, "*.md"))
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // Markdown file -> its anchors
	anchorsOf := func(p string) map[string]bool {
		if a, ok := anchors[p]; ok {
			return a
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		anchors[p] = docAnchors(string(b))
		return anchors[p]
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, l := range docLinks(string(b)) {
			target, anchor, _ := strings.Cut(l.target, "#")
			if i := strings.IndexByte(target, '?'); i >= 0 {
				target = target[:i]
			}
			if u, err := url.PathUnescape(target); err == nil {
				target = u
			}
			path := f
			switch {
			case target == "":
			case strings.HasPrefix(target, "/"):
				path = filepath.Join(root, target)
			default:
				path = filepath.Join(filepath.Dir(f), target)
			}
			checked++
			if _, err := os.Stat(path); err != nil {
				if rel, _ := filepath.Rel(root, path); pendingPages[rel] != "" {
					t.Logf("%s:%d: link %q: %s is not here yet (%s)", f, l.line, l.target, rel, pendingPages[rel])
					continue
				}
				t.Errorf("%s:%d: link %q: %s does not exist", rel, l.line, l.target, target)
				continue
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if !anchorsOf(path)[anchor] {
				t.Errorf("%s:%d: link %q: no heading of %s makes the anchor #%s", rel, l.line, l.target, filepath.Base(path), anchor)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d links in %d files: the documents' format changed?", checked, len(files))
	}
	t.Logf("checked %d links in %d files", checked, len(files))
}

// pendingPages are pages written on another branch that links here may
// name before it is merged; once the page exists its links are checked as
// any other. Remove an entry when its page has landed.
var pendingPages = map[string]string{}

type docLink struct {
	line   int
	target string
}

var (
	docCodeSpan = regexp.MustCompile("`+[^`]*`+")
	docInline   = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	docRefDef   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)`)
	docHeading  = regexp.MustCompile(`^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$`)
	docHTMLID   = regexp.MustCompile(`<a\s[^>]*\b(?:id|name)="([^"]+)"`)
	docMDLink   = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// docLinks returns the relative link targets of a Markdown document (no
// scheme, not protocol-relative), outside fenced code blocks and code spans.
func docLinks(doc string) []docLink {
	var out []docLink
	fence := ""
	for i, line := range strings.Split(doc, "\n") {
		if f := docFence(line, fence); f != "" || fence != "" {
			fence = f
			continue
		}
		line = docCodeSpan.ReplaceAllString(line, "")
		var targets []string
		for _, m := range docInline.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := docRefDef.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, tg := range targets {
			if tg == "" || strings.HasPrefix(tg, "//") {
				continue
			}
			if u, err := url.Parse(tg); err == nil && u.Scheme != "" {
				continue
			}
			out = append(out, docLink{line: i + 1, target: tg})
		}
	}
	return out
}

// docFence returns the fence that is open after line, given the one open
// before it ("" for none).
func docFence(line, open string) string {
	s := strings.TrimLeft(line, " ")
	if len(line)-len(s) > 3 {
		return open
	}
	if open != "" {
		if strings.HasPrefix(s, open) && strings.Trim(s, open[:1]+" \t") == "" {
			return ""
		}
		return open
	}
	for _, c := range []string{"```", "~~~"} {
		if strings.HasPrefix(s, c) {
			n := len(s) - len(strings.TrimLeft(s, c[:1]))
			return strings.Repeat(c[:1], n)
		}
	}
	return ""
}

// docAnchors returns the anchors GitHub makes for a Markdown document.
func docAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(doc, "\n") {
		if f := docFence(line, fence); f != "" || fence != "" {
			fence = f
			continue
		}
		for _, m := range docHTMLID.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := docHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := docSlug(m[2])
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// docSlug is GitHub's anchor for a heading's text: the text as rendered
// (links to their text, code spans and emphasis to their content),
// lowercase, every character but letters, digits, marks, '-', '_' and
// spaces removed, each space a '-'.
func docSlug(heading string) string {
	heading = docMDLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
