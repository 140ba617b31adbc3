"""Nova's answers on flavor extra specs and image properties.

Reads JSON lines {"id", "kind", "extra_specs", "image_props"} on stdin and
writes each back with "nova_valid" and "nova_error": Nova's own validators
(nova.api.validation.extra_specs.validators.validate, as the API runs them
from microversion 2.86) for the extra specs, and
nova.objects.ImageMetaProps.from_dict for the image properties.

With --generate --seed N --n M it writes M generated cases instead: valid
and invalid ones (typos of known keys, wrong enums, out-of-range numbers,
bad indexed keys, unknown namespaces, keys with characters or lengths
the API refuses, keys given in the other source's
form). Run it with /usr/bin/python3 where python3-nova is installed:

    /usr/bin/python3 extra_specs.py --generate --seed 1 --n 3000 |
        /usr/bin/python3 extra_specs.py | gzip -9 > ../extraspecs.nova.jsonl.gz
"""

import argparse
import json
import random
import sys
import warnings


def answer(case):
    from nova import exception, objects
    from nova.api.validation.extra_specs import validators

    objects.register_all()
    error = None
    try:
        # The API's schema first: key characters and lengths.
        api_schema().validate({"extra_specs": dict(case.get("extra_specs", {}))})
    except exception.ValidationError as e:
        error = "extra specs: %s" % e
    for key, value in sorted(case.get("extra_specs", {}).items()):
        if error is not None:
            break
        try:
            validators.validate(key, value)
        except exception.ValidationError as e:
            error = "extra spec %s: %s" % (key, e)
            break
    if error is None:
        try:
            objects.ImageMetaProps.from_dict(dict(case.get("image_props", {})))
        except (ValueError, exception.Invalid) as e:  # a field's, a cpu list's
            error = "image properties: %s: %s" % (type(e).__name__, e)
    out = dict(case)
    out["nova_valid"] = error is None
    out["nova_error"] = error
    return out


def api_schema():
    from nova.api.openstack.compute.schemas import flavors_extraspecs
    from nova.api.validation import validators
    return validators._SchemaValidator(flavors_extraspecs.create)


# Example values for the patterned and free-form extra specs.
PATTERN_GOOD = {
    "cpu": ["0-3,^2", "1", "0,2-3", "^0", "0-1,3"],
    "page": ["small", "large", "any", "2048", "2MB", "1GiB", "4kB", "1Gbit"],
    "pmem": ["SMALL", "4GB,SMALL", "a_1"],
    "alias": ["a1:2", "gpu:1, nic:2"],
}
PATTERN_BAD = {
    "cpu": ["0-", "a", "0,,1", "-1", "1-2-3", " 1"],
    "page": ["huge", "2 MB", "-1", "1.5GB", ""],
    "pmem": ["a-b", ",x", ""],
    "alias": ["gpu", "gpu:x", ":1"],
}
BOOL_GOOD = ["true", "False", "yes", "NO", "1", "0", "on", "off", " t ", "n"]
BOOL_BAD = ["maybe", "2", "", "truee", "enabled"]
INT_BAD = ["x", "1.5", "", "1e3", "0x10", "--1"]


def pattern_class(pattern):
    if "large" in pattern:
        return "page"
    if "a-zA-Z0-9_" in pattern:
        return "pmem"
    if "[^:]" in pattern:
        return "alias"
    return "cpu"


def spec_name(rng, validator):
    name = validator.name
    fills = {
        "{group}": rng.choice(["", "", "1", "_a", "g-2"]),
        "{num}": str(rng.randint(0, 3)),
        "{id}": str(rng.randint(0, 3)),
        "{key}": rng.choice(["ssd", "zone", "x:y"]),
        "{filter}": rng.choice(["", ":a", ":a:b"]),
        "{resource}": rng.choice(["GPU", "X_1"]),
        "{trait}": rng.choice(["MY_TRAIT", "A1"]),
    }
    for k, v in fills.items():
        name = name.replace(k, v)
    return name


def good_value(rng, v):
    t = v["type"]
    if t is bool:
        return rng.choice(BOOL_GOOD)
    if t is int:
        lo = v.get("min", -5)
        hi = v.get("max", lo + 100)
        return str(rng.randint(lo, hi))
    if "enum" in v:
        return rng.choice(list(v["enum"]))
    if "pattern" in v:
        return rng.choice(PATTERN_GOOD[pattern_class(v["pattern"])])
    return rng.choice(["x", "anything at all", "1"])


def bad_value(rng, v):
    t = v["type"]
    if t is bool:
        return rng.choice(BOOL_BAD)
    if t is int:
        out = list(INT_BAD)
        if "min" in v:
            out.append(str(v["min"] - rng.randint(1, 3)))
        if "max" in v:
            out.append(str(v["max"] + rng.randint(1, 3)))
        return rng.choice(out)
    if "enum" in v:
        e = str(rng.choice(list(v["enum"])))
        return rng.choice([e.upper(), e + "x", e[:-1], "bogus", ""])
    if "pattern" in v:
        return rng.choice(PATTERN_BAD[pattern_class(v["pattern"])])
    return None


def typo(rng, key):
    ns, _, rest = key.partition(":")
    i = rng.randrange(len(rest))
    op = rng.choice(["drop", "swap", "add", "case"])
    if op == "drop":
        rest = rest[:i] + rest[i + 1:]
    elif op == "swap" and i + 1 < len(rest):
        rest = rest[:i] + rest[i + 1] + rest[i] + rest[i + 2:]
    elif op == "case":
        rest = rest.swapcase()
    else:
        rest = rest[:i] + rng.choice("aeiou_") + rest[i:]
    return ns + ":" + rest


def image_value(rng, field, good):
    from nova.objects import fields as nf
    f = field
    vv = getattr(f._type, "_valid_values", None)
    if vv is not None:
        e = rng.choice(list(vv))
        return e if good else rng.choice([e + "x", "bogus", e.upper() if e.upper() != e else e + "_"])
    if isinstance(f, nf.IntegerField):
        return str(rng.randint(-3, 64)) if good else rng.choice(INT_BAD)
    if isinstance(f, nf.FlexibleBooleanField):
        return rng.choice(BOOL_GOOD + BOOL_BAD)
    return rng.choice(["x", "q35", "2048", "anything"])


def generate(seed, n):
    from nova import objects
    from nova.api.validation.extra_specs import validators
    objects.register_all()
    rng = random.Random(seed)
    vals = list(validators.VALIDATORS.values())
    hw = [v for v in vals if v.name.startswith(("hw:", "hw_rng:", "hw_video:"))]
    fields = objects.ImageMetaProps.fields
    img_names = sorted(k for k in fields if k not in ("hw_numa_cpus", "hw_numa_mem", "traits_required"))
    legacy = sorted(objects.ImageMetaProps._legacy_property_map)
    kinds = ["good", "good-hw", "bad-value", "typo", "bad-index", "unknown-namespace", "bad-key", "flavor-image-form",
             "image-good", "image-bad-value", "image-flavor-form", "image-hw-typo", "image-numa", "image-legacy"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        es, ip = {}, {}
        v = rng.choice(hw if kind in ("good-hw", "typo") or rng.random() < 0.5 else vals)
        if kind in ("good", "good-hw"):
            for _ in range(rng.randint(1, 3)):
                v = rng.choice(hw if kind == "good-hw" else vals)
                es[spec_name(rng, v)] = good_value(rng, v.value)
        elif kind == "bad-value":
            while bad_value(rng, v.value) is None:
                v = rng.choice(vals)
            es[spec_name(rng, v)] = bad_value(rng, v.value)
        elif kind == "typo":
            es[typo(rng, spec_name(rng, v))] = good_value(rng, v.value)
        elif kind == "bad-index":
            key = rng.choice(["hw:numa_cpus.", "hw:numa_mem.", "hw:numa_cpusX", "hw:numa_mem_"])
            es[key + rng.choice(["0", "12", "x", "-1", "", "1a"])] = rng.choice(["0-1", "1024", "x"])
        elif kind == "unknown-namespace":
            es[rng.choice(["custom", "hwx", "my_ns", "HW", "hw-rng", "trait_x!", "resourcesX+"]) + ":" +
               rng.choice(["cpu_policy", "anything", "a:b"])] = rng.choice(["dedicated", "x", ""])
            es[rng.choice(["plain_key", "hw_unknown_thing", "capabilitiesfoo"])] = "v"
        elif kind == "bad-key":
            key = rng.choice(["custom:", "hw:cpu_policy", "x", "my ns:k"])
            key += rng.choice(["", "/a", "!", "é", "\t", "@", "k" * 250])
            es[key] = rng.choice(["v", "v" * 255, "v" * 256, "ü" * 255])
        elif kind == "flavor-image-form":
            es[rng.choice([k for k in img_names if k.startswith("hw_")])] = "dedicated"
        elif kind in ("image-good", "image-bad-value"):
            for _ in range(rng.randint(1, 2)):
                name = rng.choice(img_names)
                ip[name] = image_value(rng, fields[name], kind == "image-good")
        elif kind == "image-flavor-form":
            ip[spec_name(rng, rng.choice(hw))] = "dedicated"
        elif kind == "image-hw-typo":
            name = rng.choice([k for k in img_names if k.startswith("hw_")])
            wrong = name
            while wrong in fields or wrong in legacy:  # a typo that is a real name is none
                wrong = typo(rng, "hw:" + name[3:]).replace("hw:", "hw_", 1)
            ip[wrong] = image_value(rng, fields[name], True)
        elif kind == "image-numa":
            for c in rng.sample(range(3), rng.randint(1, 3)):
                ip["hw_numa_cpus.%d" % c] = rng.choice(PATTERN_GOOD["cpu"] + PATTERN_BAD["cpu"] + ["3-1"])
                ip["hw_numa_mem.%d" % c] = rng.choice(["512", "x", "1_024", " 256 "])
        elif kind == "image-legacy":
            ip[rng.choice(legacy + ["vmware_adaptertype", "trait:HW_CPU_HYPERTHREADING"])] = rng.choice(
                ["ide", "lsiLogicsas", "bogus", "x86_64", "AMD64", "PV", "xapi", ">=1.0", "1", "required"])
        yield {"id": i, "kind": kind, "extra_specs": es, "image_props": ip}


def main():
    warnings.simplefilter("ignore")
    p = argparse.ArgumentParser()
    p.add_argument("--generate", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--n", type=int, default=3000)
    args = p.parse_args()
    if args.generate:
        for case in generate(args.seed, args.n):
            print(json.dumps(case, sort_keys=True))
        return
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(answer(json.loads(line)), sort_keys=True))


if __name__ == "__main__":
    main()
