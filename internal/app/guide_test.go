package app

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	hrefs = regexp.MustCompile(`href="([^"]*)"`)
	// A Markdown link's target: [text](target).
	mdLinks = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// Every link of the demo page and of the guide leads somewhere: the page
// is served (200), and a link to a section (#...) finds an element with
// that id on it. The crawl starts at the demo page and the guide's index
// and follows every link to this server, so it reaches every page a
// reader can. Links that leave the server (public specs the docs cite)
// are only counted: there is nothing here to fetch them from.
//
// The docs' own links to a section (README.md's and docs/*.md's, as
// written for the code host) are checked against the rendered pages too:
// the guide's heading ids are the code host's.
func TestGuideLinksResolve(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	base, err := url.Parse(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string]string{} // path -> body, of the pages fetched
	fetch := func(path string) (string, int) {
		if b, ok := bodies[path]; ok {
			return b, http.StatusOK
		}
		res, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode == http.StatusOK {
			bodies[path] = string(b)
		}
		return string(b), res.StatusCode
	}
	hasID := func(body, id string) bool { return strings.Contains(body, ` id="`+id+`"`) }

	queue := []string{"/", "/guide/"}
	seen := map[string]bool{"/": true, "/guide/": true}
	checked, outside := 0, 0
	for len(queue) > 0 {
		page := queue[0]
		queue = queue[1:]
		body, status := fetch(page)
		if status != http.StatusOK {
			t.Errorf("%s: %d", page, status)
			continue
		}
		pageURL := base.ResolveReference(&url.URL{Path: page})
		for _, m := range hrefs.FindAllStringSubmatch(body, -1) {
			href := m[1]
			if strings.HasPrefix(href, "data:") {
				continue
			}
			u, err := pageURL.Parse(href)
			if err != nil {
				t.Errorf("%s links to %q: %v", page, href, err)
				continue
			}
			if u.Host != base.Host {
				outside++
				if u.Scheme != "https" {
					t.Errorf("%s links to %s, outside the server and not https", page, href)
				}
				continue
			}
			checked++
			target, status := fetch(u.Path)
			if status != http.StatusOK {
				t.Errorf("%s links to %s: %d", page, href, status)
				continue
			}
			if u.Fragment != "" && !hasID(target, u.Fragment) {
				t.Errorf("%s links to %s: %s has no element with id %q", page, href, u.Path, u.Fragment)
			}
			// Follow the guide's pages and the demo page; the API
			// reference and the contract are leaves.
			if (u.Path == "/" || strings.HasPrefix(u.Path, "/guide/")) && !seen[u.Path] {
				seen[u.Path] = true
				queue = append(queue, u.Path)
			}
		}
	}
	t.Logf("%d links to this server checked, %d to public pages elsewhere", checked, outside)

	// Every doc is a page of the guide, and the demo page leads to the
	// guide's sections.
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs: %v %v", docs, err)
	}
	for _, d := range docs {
		if page := "/guide/" + strings.TrimSuffix(filepath.Base(d), ".md"); !seen[page] {
			t.Errorf("%s is not reachable from the demo page or the guide's index", page)
		}
	}

	// The docs' links to sections, as written for the code host.
	files := append([]string{"../../README.md"}, docs...)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		self := "/guide/" + strings.TrimSuffix(filepath.Base(f), ".md")
		for _, m := range mdLinks.FindAllStringSubmatch(string(src), -1) {
			file, fragment, ok := strings.Cut(m[1], "#")
			if !ok || strings.Contains(file, ":") {
				continue
			}
			var page string
			switch {
			case file == "" && f == "../../README.md":
				continue // the README is not in the guide; GitHub renders it
			case file == "":
				page = self
			case strings.HasSuffix(file, ".md"):
				page = "/guide/" + strings.TrimSuffix(filepath.Base(file), ".md")
			default:
				continue
			}
			target, status := fetch(page)
			if status != http.StatusOK {
				t.Errorf("%s links to %s: %s is %d", f, m[1], page, status)
				continue
			}
			if !hasID(target, fragment) {
				t.Errorf("%s links to %s: %s has no section with id %q", f, m[1], page, fragment)
			}
		}
	}

	// The old address of a doc, the Markdown file's, leads to its page.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noFollow.Get(ts.URL + "/guide/design.md")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/guide/design" {
		t.Errorf("/guide/design.md: %d to %q; want a redirect to /guide/design", res.StatusCode, res.Header.Get("Location"))
	}
}
