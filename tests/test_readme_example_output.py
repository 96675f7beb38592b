"""README.md's "Example output" block is the top of the example output it names, byte for byte.

tests/test_examples.py keeps examples/llama3-70b-8x-dgx-h100/output.txt equal to what the command
prints; this keeps the README's quote of it equal to that file, so a regenerated example cannot
leave the README showing an older cost model's figures.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_output_is_the_top_of_the_stored_output() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Example output", 1)[1].split("\n## ", 1)[0]
    linked = re.search(r"\]\((examples/[^)]+/output\.txt)\)", section)
    assert linked, "README's Example output section must link the output.txt it quotes"
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    stored = (ROOT / linked.group(1)).read_text(encoding="utf-8")
    assert block.count("\n") >= 10, "the quoted block should show at least the job and top table"
    assert stored.startswith(block), (
        f"README.md's Example output differs from the top of {linked.group(1)}: copy its first "
        f"{block.count(chr(10))} lines")
