#!/usr/bin/env python3
"""The C, C++ and Python code blocks of the README files and the guide, checked.

  python3 ci/doc_blocks.py c cpp      # each C and C++ block compiles against capi/include
  python3 ci/doc_blocks.py --include PREFIX/include c cpp    # ...or an installed package's
  python3 ci/doc_blocks.py python     # each Python block parses, and every shmbroker.NAME it
                                      # uses exists in the installed package

Rust blocks are compiled by the shmbroker-doc-blocks crate (docs/blocks) in every
`cargo test --workspace`; this script follows its conventions (docs/blocks/src/lib.rs):
- names a fragment uses come from an HTML comment right above its fence, which GitHub and
  mdBook do not show: `<!-- c setup:` (or `cpp`, `python`), lines, `-->`;
- a block with its own `main` is a program and compiles as it is; any other is a fragment and
  compiles as the body of `main`, after the setup;
- a block that must not be checked is fenced as something else (`text`).
"""

import ast
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", ROOT / "capi" / "README.md", ROOT / "python" / "README.md"] + sorted(
    (ROOT / "docs" / "guide" / "src").glob("*.md")
)

PRELUDE = {
    "c": "#include <shmbroker.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
    "#include <string.h>\n",
    "cpp": "#include <shmbroker.hpp>\n#include <chrono>\n#include <cstdint>\n#include <cstdio>\n"
    "#include <thread>\n#include <vector>\n",
}
COMPILE = {
    "c": ["cc", "-std=c11", "-Wall", "-Werror", "-Wno-unused", "-x", "c"],
    "cpp": ["c++", "-std=c++17", "-Wall", "-Werror", "-Wno-unused", "-x", "c++"],
}


def blocks(path, language):
    """(line, setup lines, code lines) of each block fenced as `language`."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith("```"):
            i += 1
            continue
        info = stripped[3:].split(",")[0].strip()
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")), None
        )
        if end is None:
            sys.exit(f"{path}:{i + 1}: a code block never closes")
        if info == language:
            yield i + 1, setup_above(lines, i, language), lines[i + 1 : end]
        i = end + 1


def setup_above(lines, fence, language):
    if fence == 0 or lines[fence - 1].strip() != "-->":
        return []
    start = fence - 2
    while start >= 0 and not lines[start].lstrip().startswith("<!--"):
        start -= 1
    if start < 0 or lines[start].strip() != f"<!-- {language} setup:":
        return []
    return lines[start + 1 : fence - 1]


def check_compiled(language, include, failures):
    count = 0
    for path in FILES:
        for line, setup, code in blocks(path, language):
            count += 1
            where = f"{path.relative_to(ROOT)}:{line}"
            body = "\n".join(setup + code)
            if re.search(r"\bmain\s*\(", body):
                source = PRELUDE[language] + body + "\n"
            else:
                session = "shmbroker_session *s = NULL;\n" if language == "c" else ""
                source = (
                    PRELUDE[language]
                    + ("int main(void) {\n" if language == "c" else "int main() {\n")
                    + session
                    + body
                    + "\nreturn 0;\n}\n"
                )
            with tempfile.NamedTemporaryFile("w", suffix="." + language) as unit:
                unit.write(source)
                unit.flush()
                result = subprocess.run(
                    COMPILE[language]
                    + ["-fsyntax-only", f"-I{include}", unit.name],
                    capture_output=True,
                    text=True,
                )
            if result.returncode != 0:
                failures.append(f"{where}: this {language} block does not compile:\n"
                                f"{result.stderr}\n--- as compiled ---\n{source}")
    print(f"{language}: {count} blocks")
    return count


def check_python(failures):
    import importlib

    package = importlib.import_module("shmbroker")
    count = 0
    for path in FILES:
        for line, setup, code in blocks(path, "python"):
            count += 1
            where = f"{path.relative_to(ROOT)}:{line}"
            source = "\n".join(setup + code)
            try:
                tree = ast.parse(source)
            except SyntaxError as error:
                failures.append(f"{where}: this python block does not parse: {error}")
                continue
            for name, owner in used_names(tree):
                module = importlib.import_module(owner) if owner != "shmbroker" else package
                if not hasattr(module, name):
                    failures.append(f"{where}: {owner}.{name} does not exist")
    print(f"python: {count} blocks")
    return count


def used_names(tree):
    """(name, module) for every `shmbroker[.sub].name` and `from shmbroker[.sub] import name`."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "shmbroker":
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else "shmbroker"
                    )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "shmbroker":
            for alias in node.names:
                yield alias.name, node.module
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            yield node.attr, aliases[node.value.id]


def main():
    arguments = sys.argv[1:]
    include = ROOT / "capi" / "include"
    if arguments[:1] == ["--include"]:
        include, arguments = pathlib.Path(arguments[1]), arguments[2:]
    if not (include / "shmbroker.h").is_file():
        sys.exit(f"no shmbroker.h in {include}")
    languages = arguments or ["c", "cpp", "python"]
    failures = []
    for language in languages:
        if language == "python":
            found = check_python(failures)
        elif language in COMPILE:
            found = check_compiled(language, include, failures)
        else:
            sys.exit(f"unknown language {language!r}: c, cpp or python")
        if found == 0:
            failures.append(f"no {language} block found: are the docs where they were?")
    if failures:
        sys.exit("\n\n".join(failures))


if __name__ == "__main__":
    main()
