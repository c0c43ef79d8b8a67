package rrl

import (
	"bytes"
	"flag"
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "rewrite testdata/api.txt from the package's exported API")

// TestExportedAPI holds the package's exported API, one declaration a line, against
// testdata/api.txt, so that growing or changing it is a visible, reviewed decision:
// run `go test -run TestExportedAPI -update-api .` and commit the new file with the
// change that needs it.
func TestExportedAPI(t *testing.T) {
	got := exportedAPI(t, ".")
	const golden = "testdata/api.txt"
	if *updateAPI {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestExportedAPI -update-api . to make it)", err)
	}
	if got == string(want) {
		return
	}
	gotSet, wantSet := lineSet(got), lineSet(string(want))
	for l := range gotSet {
		if !wantSet[l] {
			t.Errorf("exported but not in %s: %s", golden, l)
		}
	}
	for l := range wantSet {
		if !gotSet[l] {
			t.Errorf("in %s but not exported: %s", golden, l)
		}
	}
	t.Log("if the change is intended: go test -run TestExportedAPI -update-api .")
}

func lineSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		m[l] = true
	}
	return m
}

// exportedAPI lists the exported declarations of the package in dir as built for
// linux/amd64 (the platform with the most API: the kernel filter), sorted: constants,
// variables, functions, types with their exported fields and methods.
func exportedAPI(t *testing.T, dir string) string {
	t.Helper()
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH = "linux", "amd64"
	bp, err := ctx.ImportDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, bp.ImportPath)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	add := func(format string, parts ...string) {
		lines = append(lines, format+strings.Join(parts, ""))
	}
	node := func(n any) string {
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, n); err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(b.String()), " ")
	}
	values := func(vs []*doc.Value, kind string) {
		for _, v := range vs {
			for _, s := range v.Decl.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if n.IsExported() {
						add(kind+" ", n.Name)
					}
				}
			}
		}
	}
	funcs := func(fs []*doc.Func, recv string) {
		for _, f := range fs {
			d := *f.Decl
			d.Body, d.Doc = nil, nil
			if recv != "" && !ast.IsExported(recv) {
				continue
			}
			add(node(&d))
		}
	}
	values(pkg.Consts, "const")
	values(pkg.Vars, "var")
	funcs(pkg.Funcs, "")
	for _, typ := range pkg.Types {
		values(typ.Consts, "const")
		values(typ.Vars, "var")
		funcs(typ.Funcs, "")
		funcs(typ.Methods, typ.Name)
		for _, s := range typ.Decl.Specs {
			ts := s.(*ast.TypeSpec)
			switch tt := ts.Type.(type) {
			case *ast.StructType:
				add("type ", ts.Name.Name, " struct")
				for _, fl := range tt.Fields.List {
					for _, n := range fl.Names {
						if n.IsExported() {
							add("field ", ts.Name.Name, ".", n.Name, " ", node(fl.Type))
						}
					}
				}
			case *ast.InterfaceType:
				add("type ", ts.Name.Name, " interface")
				for _, m := range tt.Methods.List {
					for _, n := range m.Names {
						add("method ", ts.Name.Name, ".", n.Name, " ", node(m.Type))
					}
				}
			default:
				add("type ", ts.Name.Name, " ", node(ts.Type))
			}
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}
