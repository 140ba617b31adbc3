package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ValidateDomainXML checks doc against libvirt's domain schema with
// virt-xml-validate (deploy/deps.sh installs it). Without the tool the
// test is skipped, unless CI=true, where a missing dependency fails.
func ValidateDomainXML(t testing.TB, name, doc string) {
	t.Helper()
	tool, err := exec.LookPath("virt-xml-validate")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("virt-xml-validate not found (install libvirt-clients and libxml2-utils, see deploy/deps.sh): %v", err)
		}
		t.Skipf("virt-xml-validate not found; skipping schema validation of %s", name)
	}
	file := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, file, "domain").CombinedOutput(); err != nil {
		t.Errorf("virt-xml-validate on %s: %v\n%s\ndocument:\n%s", name, err, out, doc)
	}
}
