#!/usr/bin/python3
"""No function longer than 80 lines outside the tables that docs/design.md lists.

    function_length.py [--limit 80] [--list]

Scans the C++ (src server worker kernels tests: .h .cpp .cu) and the Python (experiments tests)
of the checkout. A C++ function is found by its braces (comments and strings removed; lambdas
and functions nested in a function count towards their enclosing function); a Python one by
ast. The exceptions are the backquoted `path: name` entries of docs/design.md's section
"Functions over 80 lines". Exit 1 naming each function over the limit that is not listed, and
each listed one that no longer is over it (the list stays true); --list prints every function
over the limit."""
import argparse
import ast
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
CPP_ROOTS = ("src", "server", "worker", "kernels", "tests")
PY_ROOTS = ("experiments", "tests")


def without_comments_and_strings(text):
    """The C++ source with comments and string/char literals emptied, line breaks kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text[i] == '"' and i > 0 and text[i - 1] == "R" and (m := re.match(r'R"([^(]*)\(', text[i - 1:])):
            end = text.find(")" + m.group(1) + '"', i)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end + len(m.group(1)) + 2
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


FUNCTION_HEAD = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(final)?\s*(->\s*[^{;]+)?\s*\{$")
CONTROL = re.compile(r"\b(if|for|while|switch|catch)\b\s*\(.*\)\s*\{$")
LAMBDA = re.compile(r"\]\s*(\([^)]*\))?\s*(mutable)?\s*(->\s*[^{]+)?\s*\{$")


def cpp_functions(path):
    """(first line, lines, head) of each outermost function body in a C++ file."""
    lines = without_comments_and_strings(path.read_text()).split("\n")
    stack, found = [], []
    for ln, line in enumerate(lines, 1):
        for k, ch in enumerate(line):
            if ch == "{":
                head = line[:k + 1].rstrip()
                context = " ".join(lines[max(0, ln - 4):ln - 1]) + " " + head
                is_function = (FUNCTION_HEAD.search(head) or re.search(r"\)\s*:\s*[^;{]*\{$", context)) \
                    and not LAMBDA.search(head) and not CONTROL.search(head.strip())
                stack.append((bool(is_function) and not any(s[0] for s in stack), ln, head.strip()))
            elif ch == "}" and stack:
                outermost, start, head = stack.pop()
                if outermost:
                    found.append((start, ln - start + 1, head))
    return found


def python_functions(path):
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.end_lineno - n.lineno + 1, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def long_functions(limit):
    """[(path relative to the checkout, line, lines, head)] of every function over `limit` lines."""
    out = []
    for root in CPP_ROOTS:
        for p in sorted((REPO / root).rglob("*")):
            if p.suffix in (".h", ".cpp", ".cu"):
                out += [(p.relative_to(REPO).as_posix(), *f) for f in cpp_functions(p) if f[1] > limit]
    for root in PY_ROOTS:
        for p in sorted((REPO / root).rglob("*.py")):
            out += [(p.relative_to(REPO).as_posix(), *f) for f in python_functions(p) if f[1] > limit]
    return out


def listed_exceptions():
    """{(path, name)} from docs/design.md's "Functions over 80 lines" section."""
    text = (REPO / "docs" / "design.md").read_text()
    m = re.search(r"^#+ Functions over 80 lines\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    if not m:
        sys.exit("function_length.py: docs/design.md has no section \"Functions over 80 lines\"")
    return set(re.findall(r"`([\w./-]+): ([^`]+)`", m.group(1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--list", action="store_true", help="print every function over the limit")
    a = ap.parse_args()
    found, allowed = long_functions(a.limit), listed_exceptions()
    if a.list:
        for path, line, n, head in found:
            print(f"{n:5d} {path}:{line}  {head}")
    bad = [(p, line, n, head) for p, line, n, head in found if not any(p == ep and name in head for ep, name in allowed)]
    stale = [(ep, name) for ep, name in allowed if not any(p == ep and name in head for p, _, _, head in found)]
    for p, line, n, head in bad:
        print(f"{p}:{line}: {n} lines (limit {a.limit}), not listed in docs/design.md: {head}")
    for ep, name in stale:
        print(f"docs/design.md lists `{ep}: {name}`, which is not over {a.limit} lines (any more): drop it")
    if not bad and not stale:
        print(f"function_length.py: no function over {a.limit} lines but the {len(allowed)} listed in docs/design.md")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
