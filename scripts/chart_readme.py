#!/usr/bin/env python3
"""The values table of charts/pdp-injector/README.md, from values.schema.json (type, description, choices) and
values.yaml (the defaults, as written there). Standard library only.

    scripts/chart_readme.py           writes the table between the README's markers
    scripts/chart_readme.py --check   fails (exit 1) when the README's table differs from what it would write,
                                      or a value of values.yaml has no description in the schema or no
                                      comment above it (.ci/run)
"""
import json
import re
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parents[1] / "charts/pdp-injector"
BEGIN = "<!-- values table: scripts/chart_readme.py writes it from values.schema.json -->"
END = "<!-- end of values table -->"


def leaves(values_text):
    """(dotted path, default as written, whether a comment is right above it) for each key of values.yaml that
    has a value on its own line."""
    out, stack, commented = [], [], False
    for line in values_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            commented = bool(stripped)
            continue
        m = re.match(r"([A-Za-z0-9_]+):\s*(.*?)\s*(#.*)?$", stripped)
        if not m:
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(1)))
        if m.group(2):
            out.append((".".join(k for _, k in stack), m.group(2), commented))
        commented = False
    return out


def schema_node(schema, path):
    node = schema
    for key in path.split("."):
        node = (node.get("properties") or {}).get(key)
        if node is None:
            return None
    return node


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def table(chart=CHART):
    """The table's text and the problems found (values without a schema entry, a description or a comment)."""
    schema = json.loads((chart / "values.schema.json").read_text())
    rows, problems = [], []
    for path, default, commented in leaves((chart / "values.yaml").read_text()):
        if not commented:
            problems.append(f"{path}: no comment above it in values.yaml")
        node = schema_node(schema, path)
        if node is None:
            problems.append(f"{path}: not in values.schema.json")
            continue
        if not node.get("description"):
            problems.append(f"{path}: no description in values.schema.json")
        types = node.get("type", "")
        kind = " or ".join(types) if isinstance(types, list) else types
        desc = node.get("description", "")
        if node.get("enum"):
            desc += " One of " + ", ".join(f"`{v}`" for v in node["enum"]) + "."
        rows.append(f"| `{path}` | {kind} | `{cell(default)}` | {cell(desc)} |")
    text = "\n".join(["| value | type | default | description |", "|---|---|---|---|", *rows])
    return text, problems


def split(readme_text):
    if BEGIN not in readme_text or END not in readme_text:
        return None
    head, rest = readme_text.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    return head, current, tail


def main(argv):
    check = "--check" in argv
    readme = CHART / "README.md"
    parts = split(readme.read_text())
    if parts is None:
        print(f"{readme}: the markers {BEGIN!r} and {END!r} are missing", file=sys.stderr)
        return 1
    head, current, tail = parts
    text, problems = table()
    for p in problems:
        print(f"charts/pdp-injector: {p}", file=sys.stderr)
    want = "\n" + text + "\n"
    if check:
        if current != want:
            print(f"{readme.relative_to(CHART.parents[1])}: the values table is stale: run scripts/chart_readme.py",
                  file=sys.stderr)
            return 1
        if not problems:
            print(f"chart README: the values table matches values.schema.json ({text.count(chr(10)) - 1} values)")
        return 1 if problems else 0
    if current != want:
        readme.write_text(head + BEGIN + want + END + tail)
        print(f"wrote the values table of {readme}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
