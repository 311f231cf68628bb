package server

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"unicode"

	"github.com/labstack/echo/v4"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/text"
	"github.com/yuin/goldmark/util"

	"github.com/retrysafe/payments/docs"
	"github.com/retrysafe/payments/web"
)

// The guide: the docs, rendered at /guide/<name> for the demo page's
// links. Written for a code host, they get only what a server needs:
// headings get the code host's ids (githubIDs), so design.md#retries lands
// on the same section here, at design#retries; a link to a file this server
// does not serve (../internal/...) is dropped, keeping its text, which
// names the file; the contract is linked at /openapi.yaml. And
// /guide/design.md redirects to /guide/design: a copy of the Markdown here
// would be a page whose relative links cannot work.

// guidePage is one rendered doc.
type guidePage struct {
	Name  string // design, for design.md
	Title string // its first heading
	Body  template.HTML
}

// renderedGuide renders the embedded docs once per process.
var renderedGuide = sync.OnceValues(func() (map[string]guidePage, error) {
	names, err := fs.Glob(docs.Files, "*.md")
	if err != nil {
		return nil, err
	}
	md := goldmark.New(
		goldmark.WithExtensions(extension.GFM),
		goldmark.WithParserOptions(
			parser.WithAutoHeadingID(),
			parser.WithASTTransformers(util.Prioritized(guideLinks{docs: names}, 100)),
		),
	)
	pages := map[string]guidePage{}
	for _, n := range names {
		src, err := fs.ReadFile(docs.Files, n)
		if err != nil {
			return nil, err
		}
		doc := md.Parser().Parse(text.NewReader(src), parser.WithContext(parser.NewContext(parser.WithIDs(newGitHubIDs()))))
		var buf bytes.Buffer
		if err := md.Renderer().Render(&buf, src, doc); err != nil {
			return nil, fmt.Errorf("render %s: %w", n, err)
		}
		name := strings.TrimSuffix(n, ".md")
		pages[name] = guidePage{Name: name, Title: firstHeading(doc, src, name), Body: template.HTML(buf.String())} // #nosec G203 -- our own docs, rendered by goldmark, which leaves raw HTML out
	}
	return pages, nil
})

// firstHeading is the text of doc's first level-1 heading, without markup, or fallback.
func firstHeading(doc ast.Node, src []byte, fallback string) string {
	for n := doc.FirstChild(); n != nil; n = n.NextSibling() {
		if h, ok := n.(*ast.Heading); !ok || h.Level != 1 {
			continue
		}
		var b strings.Builder
		_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
			if t, ok := c.(*ast.Text); ok && entering {
				b.Write(t.Segment.Value(src))
			} else if s, ok := c.(*ast.String); ok && entering {
				b.Write(s.Value)
			}
			return ast.WalkContinue, nil
		})
		return b.String()
	}
	return fallback
}

// guideLinks rewrites the docs' relative links (see the top of this file).
type guideLinks struct{ docs []string }

func (g guideLinks) Transform(doc *ast.Document, _ text.Reader, _ parser.Context) {
	var links []*ast.Link
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if l, ok := n.(*ast.Link); ok && entering {
			links = append(links, l)
		}
		return ast.WalkContinue, nil
	})
	for _, l := range links {
		dest := string(l.Destination)
		if dest == "" || strings.HasPrefix(dest, "#") || strings.Contains(dest, ":") {
			continue // a section of this page, or a public page elsewhere
		}
		file, _, _ := strings.Cut(dest, "#")
		fragment := dest[len(file):] // "" or "#section"
		switch target := path.Clean(file); {
		case slices.Contains(g.docs, target):
			l.Destination = []byte(strings.TrimSuffix(target, ".md") + fragment)
		case target == "../api/openapi.yaml":
			l.Destination = []byte("/openapi.yaml" + fragment)
		default:
			// A file of the repository: keep the text, drop the link.
			parent := l.Parent()
			for l.HasChildren() {
				parent.InsertBefore(parent, l, l.FirstChild()) // moves it out of l
			}
			parent.RemoveChild(parent, l)
		}
	}
}

// githubIDs gives headings GitHub's ids (goldmark's turn '_' into '-'):
// lower case; letters, digits, '-' and '_' kept, each space a '-', the
// rest dropped; a repeated id gets -1, -2, ...
type githubIDs struct{ used map[string]bool }

func newGitHubIDs() *githubIDs { return &githubIDs{used: map[string]bool{}} }

func (g *githubIDs) Generate(value []byte, _ ast.NodeKind) []byte {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(string(value))) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.Is(unicode.Mn, r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	id := b.String()
	for i := 1; g.used[id]; i++ {
		id = fmt.Sprintf("%s-%d", b.String(), i)
	}
	g.used[id] = true
	return []byte(id)
}

func (g *githubIDs) Put(value []byte) { g.used[string(value)] = true }

var guideTemplate = template.Must(template.New("guide").Parse(web.GuideTemplate))

func (s *Server) registerGuide(e *echo.Echo) {
	render := func(c echo.Context, data any) error {
		var buf bytes.Buffer
		if err := guideTemplate.Execute(&buf, data); err != nil {
			return err
		}
		return c.HTMLBlob(http.StatusOK, buf.Bytes())
	}
	e.GET("/guide", func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, "/guide/") })
	e.GET("/guide/", func(c echo.Context) error {
		pages, err := renderedGuide()
		if err != nil {
			return err
		}
		index := slices.SortedFunc(maps.Values(pages), func(a, b guidePage) int { return strings.Compare(a.Name, b.Name) })
		return render(c, map[string]any{"Page": guidePage{Title: "The guide"}, "Index": index})
	})
	e.GET("/guide/:page", func(c echo.Context) error {
		pages, err := renderedGuide()
		if err != nil {
			return err
		}
		name := c.Param("page")
		if md, ok := strings.CutSuffix(name, ".md"); ok {
			if _, ok := pages[md]; ok {
				return c.Redirect(http.StatusMovedPermanently, "/guide/"+md)
			}
		}
		p, ok := pages[name]
		if !ok {
			return echo.ErrNotFound
		}
		return render(c, map[string]any{"Page": p})
	})
}
