"""The docs' Python snippets run as written: every ```python block of the README,
docs/python.md and the package's README, each a program of its own (scripts/python test
type-checks the same blocks with mypy --strict)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCS = ["README.md", "docs/python.md", "crates/idemkit-python/README.md"]


def snippets() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for n, block in enumerate(re.findall(r"^```python\n(.*?)^```", text, re.M | re.S), 1):
            found.append((f"{doc}#{n}", block))
    return found


SNIPPETS = snippets()


def run(code: str) -> subprocess.CompletedProcess[str]:
    # Run from the tests' folder: `import idemkit` is the installed wheel, not the sources.
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=os.path.dirname(__file__)
    )


def test_every_doc_has_its_snippets():
    assert {name.split("#")[0] for name, _ in SNIPPETS} == set(DOCS)


@pytest.mark.parametrize(("name", "code"), SNIPPETS, ids=[name for name, _ in SNIPPETS])
def test_the_snippet_runs(name, code):
    done = run(code)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr}"


def test_the_first_program_prints_what_the_readme_says():
    # "It prints one `mail for order-9` line and three receipts, the same each time."
    first = (ROOT / "crates/idemkit-python/examples/first.py").read_text()
    readme = dict(SNIPPETS)["README.md#1"]
    assert readme.strip() in first
    lines = run(first).stdout.splitlines()
    assert [line for line in lines if line.startswith("mail for order-9")] == [lines[0]]
    receipts = [line.split(": ", 1)[1] for line in lines[1:]]
    assert len(receipts) == 3 and set(receipts) == {"receipt-order-9"}
