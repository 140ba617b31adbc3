package numa

import (
	"fmt"
	"regexp"
	"strings"
)

// ValidateImageProps checks an image's properties as Nova reads them into
// its image metadata: a property Nova knows, or a legacy name of one, must
// have a value of its form (an enum member, a whole number, a vCPU list).
// Nova ignores the names it does not know; pinflow refuses two kinds of
// them that Nova would ignore silently where the user meant a setting: a
// flavor extra spec given as an image property (hw:cpu_policy for
// hw_cpu_policy), and an hw_ name that is no image property (a typo). The
// error, an *InvalidRequestError, names the first bad property in key
// order.
func ValidateImageProps(props map[string]string) error {
	numaKeys := numaListKeys(props)
	for _, key := range sortedKeys(props) {
		if err := validateImageProp(key, props[key], numaKeys); err != nil {
			return err
		}
	}
	if v, ok := props["vmware_adaptertype"]; ok && v != "" && v != "ide" {
		// Nova takes any other adapter type as the SCSI model.
		if allowed := imagePropRules["hw_scsi_model"].check(v); allowed != "" {
			return invalid("InvalidRequest", "image property vmware_adaptertype=%q: %s", v, allowed)
		}
	}
	return nil
}

func validateImageProp(key, value string, numaKeys map[string]valueForm) error {
	if form, ok := numaKeys[key]; ok {
		return checkImageProp(key, value, form)
	}
	if field, ok := legacyImageProps[key]; ok {
		return checkImageProp(key, value, imagePropRules[field])
	}
	if form, ok := imagePropRules[key]; ok {
		return checkImageProp(key, value, form)
	}
	if ns, rest, found := strings.Cut(key, ":"); found && ns != "trait" && knownNamespace(ns) {
		msg := fmt.Sprintf("image property %s=%q: that is a flavor extra spec, which an image cannot set", key, value)
		if _, ok := imagePropRules["hw_"+rest]; ok && ns == "hw" {
			msg = fmt.Sprintf("image property %s=%q: that is the flavor's form; the image property is hw_%s", key, value, rest)
		}
		return invalid("InvalidRequest", "%s", msg)
	}
	if strings.HasPrefix(key, "hw_") && !numaListKey.MatchString(key) {
		msg := fmt.Sprintf("image property %s=%q: %s is no image property Nova knows", key, value, key)
		if near := nearestImageProp(key); near != "" {
			msg += "; did you mean " + near + "?"
		}
		return invalid("InvalidRequest", "%s", msg)
	}
	return nil
}

func checkImageProp(key, value string, form valueForm) error {
	if allowed := form.check(value); allowed != "" {
		return invalid("InvalidRequest", "image property %s=%q: %s", key, value, allowed)
	}
	return nil
}

// numaListKey matches the per-cell NUMA properties hw_numa_cpus.N and
// hw_numa_mem.N.
var numaListKey = regexp.MustCompile(`^hw_numa_(cpus|mem)\.\d+$`)

// numaListKeys are the per-cell NUMA properties Nova reads, with their
// forms: hw_numa_cpus.N and hw_numa_mem.N from N=0 up to the first one
// missing. Nova ignores those past a gap, and so does this.
func numaListKeys(props map[string]string) map[string]valueForm {
	keys := map[string]valueForm{}
	for _, l := range []struct {
		prefix string
		form   valueForm
	}{{"hw_numa_cpus.", novaCPUSpec}, {"hw_numa_mem.", whole()}} {
		for n := 0; n < maxGuestCells; n++ {
			key := fmt.Sprintf("%s%d", l.prefix, n)
			if _, ok := props[key]; !ok {
				break
			}
			keys[key] = l.form
		}
	}
	return keys
}

func nearestImageProp(key string) string {
	best, bestDist := "", 4
	for name := range imagePropRules {
		if d := editDistance(key, name); d < bestDist || (d == bestDist && name < best) {
			best, bestDist = name, d
		}
	}
	return best
}
