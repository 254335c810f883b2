#!/usr/bin/env python3
"""Reduces a rustdoc JSON file to the crate's public item paths, one per line.

Usage: public-api.py RUSTDOC_JSON > listing.txt

Walks the public tree from the crate root (modules, their items, re-exports
followed to what they name): types, functions, constants, traits and their
items, enum variants, struct fields, the inherent methods of each type and
the traits it implements (auto traits and blanket impls aside). The paths
are the ones a user writes; the listing is sorted so that a diff shows what
an edit added or removed.
"""
import json
import sys

KIND = {
    "module": "mod", "struct": "struct", "enum": "enum", "union": "union",
    "function": "fn", "trait": "trait", "trait_alias": "trait",
    "constant": "const", "static": "static", "type_alias": "type",
    "macro": "macro", "proc_macro": "macro", "variant": "variant",
    "struct_field": "field", "assoc_type": "type", "assoc_const": "const",
}


def main(path):
    doc = json.load(open(path))
    index = doc["index"]
    out = set()
    seen = set()

    def item(i):
        return index.get(str(i))

    def inner(it):
        (k, v), = it["inner"].items()
        return k, v

    def impls_of(v):
        return v.get("impls") or []

    def walk_impls(prefix, impl_ids):
        for impl_id in impl_ids:
            impl = item(impl_id)
            if impl is None:
                continue
            _, iv = inner(impl)
            if iv.get("is_synthetic") or iv.get("blanket_impl"):
                continue
            trait = iv.get("trait")
            if trait is None:
                for m in iv.get("items", []):
                    it = item(m)
                    if it and it.get("visibility") == "public" and it.get("name"):
                        k, _ = inner(it)
                        out.add(f"{KIND.get(k, k)} {prefix}::{it['name']}")
            else:
                out.add(f"impl {trait['path'].split('::')[-1]} for {prefix}")

    def walk(i, prefix, name=None):
        it = item(i)
        if it is None:
            return
        k, v = inner(it)
        name = name or it.get("name")
        here = f"{prefix}::{name}" if prefix else name
        key = (str(i), here)
        if key in seen:
            return
        seen.add(key)
        if k == "use":
            target = v.get("id")
            if v.get("is_glob"):
                t = item(target) if target is not None else None
                if t is not None:
                    for c in inner(t)[1].get("items", []):
                        ci = item(c)
                        if ci and ci.get("visibility") == "public":
                            walk(c, prefix)
                return
            if target is not None and item(target) is not None:
                walk(target, prefix, v["name"])
            else:
                out.add(f"use {prefix}::{v['name']} = {v['source']}")
            return
        if k != "impl":
            out.add(f"{KIND.get(k, k)} {here}")
        if k == "module":
            for c in v.get("items", []):
                ci = item(c)
                if ci and (ci.get("visibility") == "public" or inner(ci)[0] == "impl"):
                    walk(c, here)
        elif k == "struct":
            kind = v.get("kind")
            fields = []
            if isinstance(kind, dict):
                if "plain" in kind:
                    fields = kind["plain"].get("fields", [])
                elif "tuple" in kind:
                    fields = [f for f in kind["tuple"] if f is not None]
            for f in fields:
                fi = item(f)
                if fi and fi.get("visibility") == "public":
                    out.add(f"field {here}::{fi['name']}")
            walk_impls(here, impls_of(v))
        elif k in ("enum", "union"):
            for var in v.get("variants", []):
                vi = item(var)
                if vi:
                    out.add(f"variant {here}::{vi['name']}")
            walk_impls(here, impls_of(v))
        elif k == "trait":
            for c in v.get("items", []):
                ci = item(c)
                if ci and ci.get("name"):
                    ck, _ = inner(ci)
                    out.add(f"{KIND.get(ck, ck)} {here}::{ci['name']}")

    walk(doc["root"], "")
    for line in sorted(out):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
